"""TModule / TLayer / TChain / TextParameter: nn.Module behaviour and state_dict round trips."""

import copy
import io

import pytest
import torch
from torch import nn

import langtorch as lt


class Wrap(lt.TModule):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = lt.TextParameter(prefix)

    def forward(self, x):
        return self.prefix + x


class Branchy(lt.TModule):
    """Python control flow in forward."""

    def __init__(self):
        super().__init__()
        self.short = lt.TLayer("short: {}")
        self.long = lt.TLayer("long: {}")

    def forward(self, x):
        if len(str(x)) > 5:
            return self.long(x)
        return self.short(x)


def test_modules_are_nn_modules():
    assert issubclass(lt.TModule, nn.Module)
    assert issubclass(lt.TLayer, lt.TModule)
    assert issubclass(lt.TChain, nn.Sequential) and issubclass(lt.TChain, lt.TModule)


def test_control_flow_and_hooks():
    m = Branchy()
    seen = []
    m.register_forward_hook(lambda mod, args, out: seen.append(str(out)))
    m.register_forward_pre_hook(lambda mod, args: seen.append("pre"))
    assert str(m(lt.TextTensor("hi"))) == "short: hi"
    assert str(m(lt.TextTensor("a longer one"))) == "long: a longer one"
    assert seen == ["pre", "short: hi", "pre", "long: a longer one"]


def test_text_parameters_registry():
    m = Wrap("Q: ")
    assert [n for n, _ in m.named_text_parameters()] == ["prefix"]
    assert list(m.parameters()) == []
    with pytest.raises(TypeError, match="assign to self.prefix.data"):
        m.prefix = "not a parameter"
    m.prefix.data = "A: "
    assert str(m(lt.TextTensor("x"))) == "A: x"
    del m.prefix
    assert list(m.named_text_parameters()) == []


def test_text_parameter_before_init_is_clear():
    class Bad(lt.TModule):
        def __init__(self):
            self.p = lt.TextParameter("x")

    with pytest.raises(AttributeError, match="super"):
        Bad()


def test_tlayer_grid_and_activation():
    layer = lt.TLayer([["Define {}"], ["Explain {}"]], activation=lambda t: t.map(str.upper))
    out = layer(["entropy", "gravity"])
    assert out.shape == (2, 2) and out[1, 0].item() == "EXPLAIN ENTROPY"
    assert lt.TLayer()(lt.TextTensor("x")).item() == "x"
    assert not lt.TLayer("x", trainable=False).prompt.requires_grad


def test_tchain_composes_modules_and_functions():
    chain = lt.TChain(lt.TLayer("Q: {}"), lambda t: t.map(str.strip), Wrap(">> "))
    assert chain(lt.TextTensor(["a "])).tolist() == [">> Q: a"]
    assert [n for n, _ in chain.named_text_parameters()] == ["0.prompt", "2.prefix"]
    with pytest.raises(TypeError, match="module or a callable"):
        lt.TChain(3)


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_state_dict_roundtrip_weights_only():
    class Mixed(lt.TModule):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)
            self.chain = lt.TChain(lt.TLayer([["a {}"], ["b {}"]]), Wrap("p"))

        def forward(self, x):
            return self.chain(x)

    src = Mixed()
    src.chain[0].prompt.data = [["A {}"], ["B {}"]]
    state = _roundtrip(src.state_dict())
    assert state["chain.0.prompt"] == [["A {}"], ["B {}"]] and state["chain.1.prefix"] == "p"
    dst = Mixed()
    result = dst.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert dst.chain[0].prompt.tolist() == [["A {}"], ["B {}"]]
    assert torch.equal(dst.linear.weight, src.linear.weight)


def test_load_state_dict_errors():
    m = Wrap("x")
    with pytest.raises(RuntimeError, match="Missing key"):
        m.load_state_dict({})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        m.load_state_dict({"prefix": "y", "other": "z"})
    with pytest.raises(RuntimeError, match="size mismatch"):
        m.load_state_dict({"prefix": ["a", "b"]})
    with pytest.raises(RuntimeError, match="expected str"):
        m.load_state_dict({"prefix": 3})
    assert m.load_state_dict({}, strict=False).missing_keys == ["prefix"]
    # As in torch, matching entries were copied before the unexpected key was reported;
    # the malformed values (wrong shape, non-text) were not.
    assert str(m.prefix) == "y"


def test_deepcopy_and_repr():
    m = lt.TChain(Wrap("p: "))
    c = copy.deepcopy(m)
    c[0].prefix.data = "q: "
    assert str(m[0].prefix) == "p: " and str(c[0].prefix) == "q: "
    assert "prefix=TextTensor('p: ')" in repr(m)


def test_text_parameter_ops_return_plain_tensors():
    p = lt.TextParameter(["a {}", "b {}"])
    assert type(p + "x") is lt.TextTensor
    assert type(p[0]) is lt.TextTensor
    assert p.data.is_template


def test_text_parameter_state_is_kept_by_copies_pytrees_and_state_dicts():
    import pickle

    import jax

    p = lt.TextParameter({"q": ["a", "b"], "tone": "dry"}, requires_grad=False)
    p.metadata["score"] = [1, 2]
    for c in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert c.fields == ("q", "tone") and c.metadata["score"].tolist() == [1, 2]
        assert not c.requires_grad
    assert not jax.tree_util.tree_map(lambda x: x, p).requires_grad

    class Holder(lt.TModule):
        def __init__(self):
            super().__init__()
            self.rec = lt.TextParameter({"q": ["x", "y"], "tone": "wet"})

    src, dst = Holder(), Holder()
    src.rec.data = {"q": ["a", "b"], "tone": "dry"}
    dst.load_state_dict(_roundtrip(src.state_dict()))
    assert dst.rec.fields == ("q", "tone") and dst.rec["tone"].tolist() == ["dry", "dry"]


def test_shared_text_parameter_listed_once():
    shared = lt.TextParameter("s")
    a, b = lt.TModule(), lt.TModule()
    a.p, b.p = shared, shared
    chain = lt.TChain(a, b)
    assert [n for n, _ in chain.named_text_parameters()] == ["0.p"]



def test_a_parameter_knows_its_registered_name_publicly():
    # Traces, optimizers and backward prompts read the name through the public attribute.
    import pickle

    m = Wrap("Q: {}")
    assert m.prefix.name == "prefix" and lt.TextParameter("x").name is None
    assert copy.deepcopy(m.prefix).name == pickle.loads(pickle.dumps(m.prefix)).name == "prefix"
    with lt.trace() as tr:
        m(lt.TextTensor(["a"]))
    assert [r["name"] for r in tr.graph_records() if r["op"] == "parameter"] == ["prefix"]
