"""A loaded decoder checkpoint of any supported architecture, as a JAX causal language model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional.models import decoder

__all__ = ["CausalLM"]


def _forward_impl(params, ids, positions, mask, *, config):
    return decoder.forward(params, ids, positions, mask, config=config)


_forward = jax.jit(_forward_impl, static_argnames=("config",))


class CausalLM:
    """A decoder checkpoint (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3) in JAX.

    Made by :func:`langtorch.models.load`; the maths is
    :mod:`langtorch.functional.models.decoder` with this model's ``config``.

    Attributes:
        name: the model's name (the directory or file name unless given).
        architecture: its family (``"llama"``, ``"gemma3"``, ...).
        config: its :class:`~langtorch.functional.models.decoder.DecoderConfig`.
        tokenizer: its :class:`~langtorch.functional.loaders.Tokenizer` (``encode``,
            ``decode``, ``apply_chat_template``).
        params: the parameter pytree (jax arrays in ``dtype``).
        dtype: ``"float32"`` or ``"bfloat16"``.
        prefill_dtype, decode_dtype, kv_dtype: the decode engine's defaults
            (:class:`EngineOptions.of <langtorch.models.EngineOptions>` reads them): the
            params' dtype (``None``) for prompts and decode steps, and a float32 KV cache for
            a float32 model.
        eos_ids: every id that ends a generation; ``eos_id`` is the first.

    Example:
        >>> import langtorch.models as M
        >>> lm = M.load("path/to/Qwen2.5-0.5B-Instruct")  # doctest: +SKIP
        >>> ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(
        ...     [{"role": "user", "content": "Hi"}]), add_special_tokens=False)  # doctest: +SKIP
        >>> lm.logits(ids).shape[1] == lm.config.vocab_size  # doctest: +SKIP
        True
    """

    def __init__(self, params: Any, config: decoder.DecoderConfig, tokenizer: Any, *,
                 name: str, dtype: str = "float32", path: str | None = None):
        self.params = params
        self.config = config
        self.tokenizer = tokenizer
        self.name = name
        self.dtype = dtype
        self.path = path
        self.eos_ids = tuple(tokenizer.eos_ids)
        self.eos_id = self.eos_ids[0] if self.eos_ids else -1
        self.pad_id = self.eos_id if self.eos_id >= 0 else 0
        # The engine's defaults for this model (read by EngineOptions.of): prefill and decode
        # in the params' dtype, and a float32 KV cache for a float32 model, so that greedy decoding
        # through any caller's engine (LocalBackend, serve) equals transformers'.
        self.prefill_dtype = None
        self.decode_dtype = None
        self.kv_dtype = "float32" if dtype == "float32" else "bfloat16"

    @property
    def architecture(self) -> str:
        """The model's family (``config.architecture``)."""
        return self.config.architecture

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no BOS added — the ``SmolLM2.encode`` protocol the local
        consumers use on rendered chat templates (which write their own BOS); use
        ``tokenizer.encode(text)`` for raw text with the model's BOS rule.

        Example:
            >>> import langtorch.models as M
            >>> lm = M.load("path/to/model")  # doctest: +SKIP
            >>> lm.encode("Hello") == lm.tokenizer.encode("Hello", add_special_tokens=False)  # doctest: +SKIP
            True
        """
        return self.tokenizer.encode(text, add_special_tokens=False)

    def apply_chat_template(self, messages: Sequence[Any], *,
                            add_generation_prompt: bool = True) -> str:
        """The model's chat template rendered (``tokenizer.apply_chat_template``).

        Example:
            >>> import langtorch.models as M
            >>> M.load("path/to/model").apply_chat_template(
            ...     [{"role": "user", "content": "Hi"}])  # doctest: +SKIP
            '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n'
        """
        return self.tokenizer.apply_chat_template(messages,
                                                  add_generation_prompt=add_generation_prompt)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, special tokens skipped (used by the decode engine to stream text).

        Example:
            >>> import langtorch.models as M
            >>> M.load("path/to/model").decode([9906])  # doctest: +SKIP
            'Hello'
        """
        return self.tokenizer.decode(ids)

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Next-token logits ``[T, V]`` (float32) at every position of one id sequence.

        Raises:
            ValueError: an id outside the vocabulary.

        Example:
            >>> import langtorch.models as M
            >>> M.load("path/to/model").logits([1, 2, 3]).shape  # doctest: +SKIP
            (3, 151936)
        """
        ids = [int(i) for i in token_ids]
        if not ids:
            raise ValueError(f"{self.name}.logits: expected at least one token id, got none.")
        decoder.check_token_ids(ids, self.config.vocab_size)
        a = jnp.asarray([ids], jnp.int32)
        out, _ = _forward(self.params, a, jnp.arange(a.shape[1])[None], jnp.ones_like(a),
                          config=self.config)
        return np.asarray(out[0], np.float32)

    @property
    def engine(self) -> Any:
        """The decode engine shared by every caller of this model (created on first use; runs
        in the model's dtype, with a float32 KV cache for a float32 model so that greedy
        decoding equals transformers')."""
        from langtorch.models._engine import engine_for

        return engine_for(self)

    def generate(self, token_ids: Sequence[int], max_tokens: int = 64, temperature: float = 0.0,
                 *, top_p: float = 1.0, seed: int = 0) -> list[int]:
        """New token ids after ``token_ids`` through the shared decode engine (greedy at
        ``temperature=0``), ending at an EOS id (included) or after ``max_tokens``.

        Example:
            >>> import langtorch.models as M
            >>> lm = M.load("path/to/model")  # doctest: +SKIP
            >>> len(lm.generate(lm.tokenizer.encode("Hello"), max_tokens=4)) <= 4  # doctest: +SKIP
            True
        """
        import threading

        from langtorch.functional import engine as E

        seq = E.Sequence([int(i) for i in token_ids], max_tokens=int(max_tokens),
                         temperature=float(temperature), top_p=float(top_p), seed=int(seed))
        done = threading.Event()
        errors: list[BaseException] = []

        def on_error(exc):
            errors.append(exc)
            done.set()

        try:
            self.engine.submit([seq], on_done=lambda p, c: done.set(), on_error=on_error)
        except ValueError as exc:
            raise ValueError(f"{self.name}.generate: {exc}") from None
        done.wait()
        if errors:
            raise errors[0]
        return [int(t) for t in seq.tokens]

    def __repr__(self) -> str:
        return (f"CausalLM({self.name!r}, architecture={self.architecture!r}, "
                f"dtype={self.dtype!r})")
