"""One way to read a path a user gives: ``~`` and environment variables expanded.

Every langtorch function that takes a file or folder from the user (``cache=``, ``Index.save``,
``Trace.save``, ...) passes it through :func:`user_path`, so ``"~/.cache/x"`` and
``"$HOME/x"`` mean what they mean in a shell — never a folder literally named ``~`` or ``$HOME``
under the working directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

__all__ = ["user_path"]

# What os.path.expandvars would expand: $NAME and ${NAME}.
_VARIABLE = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def user_path(path: Any, *, what: str = "path") -> Path:
    """A user-given path with environment variables (``$NAME``, ``${NAME}``) and ``~`` / ``~user``
    expanded, as a :class:`pathlib.Path` (relative paths stay relative to the working directory).

    Args:
        path: a ``str`` or ``os.PathLike`` (``bytes`` paths are refused).
        what: how the error messages name the argument (e.g. ``"Index.save: path"``).

    Raises:
        TypeError: ``path`` is not a ``str`` or ``os.PathLike`` of ``str``.
        ValueError: ``path`` names an environment variable that is not set (expanding it would
            silently make a file or folder literally named ``$NAME``), starts with ``~user`` of
            no such user (it would make a folder literally named ``~user``), or it is empty.

    Example:
        >>> import os
        >>> os.environ["LT_DOC_DIR"] = "/tmp/lt-doc"
        >>> str(user_path("$LT_DOC_DIR/index")), str(user_path("${LT_DOC_DIR}/t.jsonl"))
        ('/tmp/lt-doc/index', '/tmp/lt-doc/t.jsonl')
        >>> user_path("~/.cache/langtorch") == Path.home() / ".cache" / "langtorch"
        True
    """
    if isinstance(path, (bytes, bytearray)):
        raise TypeError(f"{what} must be a str or os.PathLike, got bytes {path!r}; decode it first")
    try:
        text = os.fspath(path)
    except TypeError:
        raise TypeError(f"{what} must be a str or os.PathLike (a file or folder), got "
                        f"{type(path).__name__} ({path!r:.60})") from None
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str or os.PathLike of str, got {type(text).__name__}")
    if not text:
        raise ValueError(f"{what} is empty; give a file or folder, e.g. '~/.cache/langtorch/x'")
    missing = [m.group(1) if m.group(1) is not None else m.group(2)
               for m in _VARIABLE.finditer(text)
               if (m.group(1) if m.group(1) is not None else m.group(2)) not in os.environ]
    if "" in missing:
        raise ValueError(f"{what} {text!r} has an empty ${{}} (no variable name); write the "
                         "variable's name in it (${HOME}) or the path out")
    if missing:
        raise ValueError(
            f"{what} {text!r} uses the environment variable {missing[0]} which is not set; set "
            f"it (export {missing[0]}=...) or write the path out")
    out = os.path.expanduser(os.path.expandvars(text))
    if out.startswith("~"):  # ~user of no such user: never a folder literally named ~user
        raise ValueError(f"{what} {text!r} starts with {out.split(os.sep, 1)[0]!r}, which names "
                         "no user on this machine; write the folder out (or ~/... for your own)")
    return Path(out)
