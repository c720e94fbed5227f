"""llama-cpp-python as a benchmark peer, with its broken AMX weight repacking switched off.

llama.cpp built natively on this machine (a Sapphire Rapids-class Xeon VM reporting AMX) puts the
weights in its "AMX" extra buffer type, and every multi-token ``llama_decode`` then segfaults
(0.3.36, seen here; the AMX tile kernels do not run in this VM). ``use_extra_bufts=False`` keeps the weights in the ordinary CPU buffer,
where the same build runs correctly (it still uses its AVX512 kernels).

Run as a script, it starts ``llama_cpp.server`` with the patch applied (same arguments).
"""

from __future__ import annotations

import sys


def no_extra_buffers() -> None:
    """Make every ``llama_cpp.Llama`` load its weights without extra (repacking) buffer types."""
    import llama_cpp
    import llama_cpp.llama_cpp as low

    default = low.llama_model_default_params
    if getattr(default, "_langtorch_patched", False):
        return

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    params._langtorch_patched = True
    low.llama_model_default_params = params
    llama_cpp.llama_model_default_params = params


if __name__ == "__main__":
    no_extra_buffers()
    from llama_cpp.server.__main__ import main

    sys.argv[0] = "llama_cpp.server"
    main()
