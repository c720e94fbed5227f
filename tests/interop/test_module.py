"""JaxModule and the torch modules over the JAX core."""

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from langtorch.functional import TextTensor
from langtorch.functional.models import bert, llama
from langtorch.interop import (
    InteropError,
    JaxModule,
    MiniLMEncoder,
    SmolLM2Decoder,
    SoftPrompt,
    embedding_to_torch,
)


def _init(key, d_in=3, d_out=2):
    k1, k2 = jax.random.split(key)
    return {"lin": {"w": jax.random.normal(k1, (d_in, d_out)), "b": jnp.zeros(d_out)},
            "blocks": [jax.random.normal(k2, (d_out,)), jnp.ones(d_out)],
            "step": jnp.zeros((), jnp.int32)}


def _apply(p, x, *, training):
    y = (x @ p["lin"]["w"] + p["lin"]["b"]) * p["blocks"][0] + p["blocks"][1]
    return y * 2.0 if training else y  # a visible train/eval difference


def _random_params(random_params, cfg, seed=0):
    """Random weights of the model's structure without compiling JAX's RNG ops (fast)."""
    shapes = jax.eval_shape(lambda: random_params(jax.random.key(0), cfg))
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda s: (0.3 * rng.standard_normal(s.shape)).astype(s.dtype), shapes)


def _module(seed=0):
    return JaxModule.from_init(_init, _apply, jax.random.key(seed))


def test_parameters_mirror_the_pytree():
    m = _module()
    assert sorted(m.state_dict()) == ["params.blocks.0", "params.blocks.1", "params.lin.b",
                                      "params.lin.w", "params.step"]
    assert sorted(n for n, _ in m.named_parameters()) == [
        "params.blocks.0", "params.blocks.1", "params.lin.b", "params.lin.w"]
    assert m.params.step.dtype == torch.int32  # integer leaf -> buffer


def test_training_flag_is_passed_explicitly():
    m = _module()
    x = torch.randn(4, 3)
    train = m(x)
    m.eval()
    torch.testing.assert_close(train, 2 * m(x))


def test_gradients_reach_parameters_and_match_torch():
    m = _module()
    x = torch.randn(4, 3)
    m(x).pow(2).sum().backward()
    p = {k: v.detach().clone().requires_grad_() for k, v in m.named_parameters()}
    ref = ((x @ p["params.lin.w"] + p["params.lin.b"]) * p["params.blocks.0"]
           + p["params.blocks.1"]) * 2.0
    ref.pow(2).sum().backward()
    for name, param in m.named_parameters():
        torch.testing.assert_close(param.grad, p[name].grad)


def test_views_are_cached_and_remade_on_change():
    m = _module()
    w = m.params.lin.w
    v1 = m.jax_params()["lin"]["w"]
    assert v1.unsafe_buffer_pointer() == w.data_ptr()
    assert m.jax_params()["lin"]["w"] is v1  # unchanged -> same cached view
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randn(2, 3)).sum().backward()
    opt.step()  # in-place update bumps _version
    v2 = m.jax_params()["lin"]["w"]
    assert v2 is not v1 and v2.unsafe_buffer_pointer() == w.data_ptr()
    np.testing.assert_array_equal(np.asarray(v2), w.detach().numpy())
    with torch.no_grad():
        m.params.lin.w = torch.nn.Parameter(torch.zeros(3, 2))  # new storage
    assert m.jax_params()["lin"]["w"].unsafe_buffer_pointer() == m.params.lin.w.data_ptr()


def test_state_dict_round_trip_weights_only():
    m = _module(seed=0)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    m(torch.randn(3, 3)).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    m2 = _module(seed=1)
    m2.load_state_dict(state)
    x = torch.randn(5, 3)
    m.eval()
    m2.eval()
    torch.testing.assert_close(m2(x), m(x), rtol=0, atol=0)


def test_dtype_conversion_follows_x64_rule():
    m = _module().double()
    with pytest.raises(InteropError, match="x64"):
        m(torch.randn(2, 3, dtype=torch.float64))
    with jax.enable_x64(True):
        assert m(torch.randn(2, 3, dtype=torch.float64)).dtype == torch.float64


def test_soft_prompt_module():
    sp = SoftPrompt(3, 4, seed=0)
    emb = torch.randn(2, 5, 4)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])  # int64, as tokenizers give
    out, m = sp(emb, mask)
    assert out.shape == (2, 8, 4) and m.dtype == torch.int64
    assert m.tolist() == [[1] * 8, [1] * 6 + [0] * 2]
    torch.testing.assert_close(out[:, :3], sp.prompt.detach().expand(2, 3, 4))
    torch.testing.assert_close(out[:, 3:], emb)
    out.sum().backward()
    torch.testing.assert_close(sp.prompt.grad, torch.full((3, 4), 2.0))
    assert list(sp.state_dict()) == ["params.prompt"]
    _, m_none = sp(emb)
    assert m_none.shape == (2, 8)


def test_minilm_encoder_small_config_matches_functional():
    cfg = bert.BertConfig(vocab_size=30, hidden_size=8, num_layers=2, num_heads=2,
                          intermediate_size=16, max_positions=16)
    params = _random_params(bert.random_params, cfg)
    enc = MiniLMEncoder(params, cfg, pooling="mean")
    assert not any(p.requires_grad for p in enc.parameters())  # frozen by default
    ids = torch.tensor([[2, 5, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    encode = jax.jit(bert.encode, static_argnames="config")
    ref = encode(params, jnp.asarray(ids.numpy(), jnp.int32),
                 jnp.asarray(mask.numpy(), jnp.int32), config=cfg)
    pooled = (ref * mask.numpy()[..., None]).sum(1) / 3
    pooled = pooled / jnp.linalg.norm(pooled, axis=-1, keepdims=True)
    np.testing.assert_allclose(enc(ids, mask).numpy(), np.asarray(pooled), rtol=1e-5, atol=1e-6)


def test_soft_prompt_through_decoder_trains_prompt_only():
    cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=2, num_heads=2,
                            num_kv_heads=1, head_dim=4, intermediate_size=8)
    dec = SmolLM2Decoder(_random_params(llama.random_params, cfg), cfg)
    sp = SoftPrompt.from_vocab(dec.word_embeddings, 2)
    ids = torch.tensor([[0, 3, 4, 5], [6, 7, 8, 9]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    embeds, full_mask = sp(dec.word_embeddings[ids], mask)
    logits = dec(inputs_embeds=embeds, attention_mask=full_mask)
    assert logits.shape == (2, 6, 16)
    loss = torch.nn.functional.cross_entropy(logits[:, 2:-1].reshape(-1, 16),
                                             ids[:, 1:].reshape(-1))
    loss.backward()
    assert sp.prompt.grad is not None and sp.prompt.grad.abs().sum() > 0
    assert all(p.grad is None for p in dec.parameters())


def test_embedding_to_torch():
    emb = jnp.arange(6.0).reshape(2, 3)
    tt = TextTensor(["a", "b"]).with_embedding(emb)
    t = embedding_to_torch(tt)
    assert t.data_ptr() == emb.unsafe_buffer_pointer() and t.shape == (2, 3)
    tn = TextTensor(["a"]).with_embedding(np.ones((1, 4), np.float32))
    assert embedding_to_torch(tn, dtype=torch.float64).dtype == torch.float64
    with pytest.raises(InteropError, match="embedding"):
        embedding_to_torch(TextTensor(["a"]))


# -- regression tests from the interop review --------------------------------------------------
def test_copies_after_forward_are_independent():
    import copy
    import gc
    import pickle

    from langtorch.interop._bridge import _REGISTRY

    m = _module()
    x = torch.randn(2, 3)
    ref = m(x).detach()
    m.jax_params()  # fills the view cache (JAX arrays, weakrefs)
    m2 = copy.deepcopy(m)
    m3 = pickle.loads(pickle.dumps(m))
    assert m2._views == {} and m2._fn.cache_size() == 0
    assert len({m._fn._uid, m2._fn._uid, m3._fn._uid}) == 3  # own compile identity each
    del m
    gc.collect()
    for c in (m2, m3):
        assert _REGISTRY[c._fn._uid] is c._fn
        torch.testing.assert_close(c(x), ref)
        assert c.jax_params()["lin"]["w"].unsafe_buffer_pointer() == c.params.lin.w.data_ptr()


def test_torch_func_grad_over_functional_call():
    m = _module()
    x = torch.randn(4, 3)
    params = {k: v.detach() for k, v in m.named_parameters()}
    g = torch.func.grad(lambda p: torch.func.functional_call(m, p, (x,)).pow(2).sum())(params)
    m(x).pow(2).sum().backward()
    for name, param in m.named_parameters():
        torch.testing.assert_close(g[name], param.grad)
    # a substituted plain tensor is used but not cached (the parameter's view stays)
    w = m.params.lin.w
    view = m.jax_params()["lin"]["w"]
    other = {"params.lin.w": torch.zeros(3, 2)}
    out = torch.func.functional_call(m, other, (x,))
    b0, b1 = (getattr(m.params.blocks, k).detach() for k in ("0", "1"))
    torch.testing.assert_close(out, (m.params.lin.b.detach() * b0 + b1).expand(4, 2) * 2.0)
    assert m.params.lin.w is w and m.jax_params()["lin"]["w"] is view


def test_non_contiguous_parameters_are_never_stale():
    def apply(p, x, *, training):
        return x @ p["w"]

    x = torch.ones(1, 3)
    m = JaxModule(apply, {"w": torch.ones(2, 3).t()})  # transposed input: stored contiguous
    assert m.params.w.is_contiguous()
    assert m.jax_params()["w"].unsafe_buffer_pointer() == m.params.w.data_ptr()
    m(x)
    m.params.w.data.mul_(0)  # .data writes do not bump _version: only a true view sees them
    assert m(x).abs().sum().item() == 0.0
    # a non-contiguous parameter assigned later is converted (copied) on every forward
    m.params.w = torch.nn.Parameter(torch.ones(2, 3).t())
    assert m(x).tolist() == [[3.0, 3.0]]
    m.params.w.data.mul_(0)
    assert m(x).abs().sum().item() == 0.0
