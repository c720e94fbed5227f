"""Text modules: :class:`TModule`, :class:`TLayer`, :class:`TChain`.

They are ``torch.nn.Module``s whose ``forward`` takes and returns TextTensors. Python control
flow in ``forward`` is fine (the graph is dynamic, as in PyTorch eager mode); hooks, ``train()``,
``eval()``, ``named_modules()`` and ``state_dict()`` work as for any module.

Text parameters (:class:`~langtorch.TextParameter`) are registered when assigned as attributes,
listed by :meth:`TModule.named_text_parameters`, and stored in ``state_dict()`` under their
attribute path as plain ``str`` (or nested lists of ``str``), so a state dict saved with
``torch.save`` loads with ``torch.load(path, weights_only=True)``: no pickled Python objects.

Example:
    >>> import torch, langtorch as lt
    >>> layer = lt.TLayer("Summarize in one line: {}")
    >>> sorted(layer.state_dict())
    ['prompt']
    >>> layer(lt.TextTensor(["a long text"])).tolist()
    ['Summarize in one line: a long text']
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import nn

from langtorch import tracing
from langtorch.core import context as _context
from langtorch.errors import TemplateError
from langtorch.tensor import TextParameter, TextTensor

__all__ = ["TModule", "TLayer", "TChain", "TFunction"]


def _state_value(p: TextParameter) -> Any:
    """Plain data for the state dict: str (0-d), nested lists of str, or, for keyed records, a
    dict of field name -> such values. Loads with ``torch.load(weights_only=True)``."""
    if p.fields:
        return {name: p[name].tolist() for name in p.fields}
    return p.tolist()


class TModule(nn.Module):
    """Base class of text modules: a ``torch.nn.Module`` mapping TextTensors to TextTensors.

    Subclass it and write ``forward``; call ``super().__init__()`` first. Assigning a
    :class:`~langtorch.TextParameter` registers it (like ``nn.Parameter``).

    Example:
        >>> import langtorch as lt
        >>> class Shout(lt.TModule):
        ...     def forward(self, x):
        ...         return x.map(str.upper)
        >>> Shout()(lt.TextTensor(["hi"])).tolist()
        ['HI']
    """

    # The span kind of a call in a trace; None for modules that open their own (LLM, Embed).
    _trace_kind: str | None = "module"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.__dict__.setdefault("_text_parameters", {})

    # ------------------------------------------------------------------ text parameter registry
    def __setattr__(self, name: str, value: Any) -> None:
        texts = self.__dict__.get("_text_parameters")
        if isinstance(value, TextParameter):
            if texts is None:
                raise AttributeError(
                    "cannot assign a TextParameter before TModule.__init__() call; call "
                    "super().__init__() first in your module's __init__"
                )
            for store in ("_parameters", "_buffers", "_modules"):
                self.__dict__.get(store, {}).pop(name, None)
            self.__dict__.pop(name, None)
            texts[name] = value
            if value.name is None:
                value.name = name
            return
        if texts is not None and name in texts:
            if value is None:
                texts[name] = None
                return
            raise TypeError(
                f"cannot assign {type(value).__name__} as text parameter {name!r} (TextParameter "
                f"or None expected); to change its text, assign to self.{name}.data"
            )
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        texts = self.__dict__.get("_text_parameters")
        if texts is not None and name in texts:
            p = texts[name]
            if p is not None:
                override = _overrides.get()
                if override is not None and id(p) in override:
                    return override[id(p)]
            return p
        return super().__getattr__(name)

    # ------------------------------------------------------------------------ calls: path, span
    def _enter_scope(self) -> tuple[Any, Any] | None:
        """Push this module onto the call path (``None`` when it is already the current one)."""
        parent = _context.current_module.get()
        if parent is self:
            return None
        name = _child_name(parent, self) if parent is not None else None
        path = _context.call_path.get() + (name if name is not None else type(self).__name__,)
        return _context.call_path.set(path), _context.current_module.set(self)

    @staticmethod
    def _exit_scope(tokens: tuple[Any, Any] | None) -> None:
        if tokens is not None:
            _context.current_module.reset(tokens[1])
            _context.call_path.reset(tokens[0])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tokens = self._enter_scope()
        try:
            if _context.active_trace.get() is None or self._trace_kind is None:
                return super().__call__(*args, **kwargs)
            inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, TextTensor)]
            with tracing.span("module", type(self).__name__, path=_context.path_string(), inputs=inputs) as s:
                out = super().__call__(*args, **kwargs)
                outs = out if isinstance(out, (tuple, list)) else (out,)
                outs = [o for o in outs if isinstance(o, TextTensor)]
                if outs:
                    tracing.set_outputs(s, *outs)
                return out
        finally:
            self._exit_scope(tokens)

    def __delattr__(self, name: str) -> None:
        texts = self.__dict__.get("_text_parameters")
        if texts is not None and name in texts:
            del texts[name]
        else:
            super().__delattr__(name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.__dict__.get("_text_parameters", {})))

    def register_text_parameter(self, name: str, param: TextParameter | None) -> None:
        """Register a text parameter under ``name`` (same as assigning the attribute).

        Example:
            >>> import langtorch as lt
            >>> m = lt.TModule(); m.register_text_parameter("style", lt.TextParameter("terse"))
            >>> [n for n, _ in m.named_text_parameters()]
            ['style']
        """
        if param is not None and not isinstance(param, TextParameter):
            raise TypeError(f"expected a TextParameter or None, got {type(param).__name__}")
        if param is None:
            self.__dict__["_text_parameters"][name] = None
        else:
            setattr(self, name, param)

    def named_text_parameters(
        self, prefix: str = "", recurse: bool = True
    ) -> Iterator[tuple[str, TextParameter]]:
        """Yield ``(dotted name, TextParameter)`` for this module (and submodules).

        Example:
            >>> import langtorch as lt
            >>> chain = lt.TChain(lt.TLayer("a {}"), lt.TLayer("b {}"))
            >>> [n for n, _ in chain.named_text_parameters()]
            ['0.prompt', '1.prompt']
        """
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        seen: set[int] = set()  # a parameter shared by two modules is listed once, as in torch
        for mod_prefix, module in modules:
            for name, p in module.__dict__.get("_text_parameters", {}).items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_prefix}.{name}" if mod_prefix else name), p

    def text_parameters(self, recurse: bool = True) -> Iterator[TextParameter]:
        """Yield every TextParameter (see :meth:`named_text_parameters`).

        Example:
            >>> import langtorch as lt
            >>> len(list(lt.TLayer("x {}").text_parameters()))
            1
        """
        for _, p in self.named_text_parameters(recurse=recurse):
            yield p

    # --------------------------------------------------------------------------- state dict
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, p in self.__dict__.get("_text_parameters", {}).items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else _state_value(p)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        own = {prefix + n: p for n, p in self.__dict__.get("_text_parameters", {}).items() if p is not None}
        for key, p in own.items():
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = state_dict[key]
            if isinstance(value, TextParameter):
                value = value.data
            try:
                new = TextTensor(value)
            except TemplateError as e:
                # The saved text is text, but not a template a TextParameter can hold.
                error_msgs.append(
                    f'While copying the text parameter named "{key}": the saved text is not a '
                    f"valid template, so the parameter is left as it was: {e}"
                )
                continue
            except (TypeError, ValueError) as e:
                error_msgs.append(
                    f'While copying the text parameter named "{key}": expected str or nested '
                    f"lists of str, got {type(value).__name__} ({e})"
                )
                continue
            if new.shape != p.shape:
                error_msgs.append(
                    f'size mismatch for text parameter "{key}": copying a text of shape '
                    f"{new.shape} from the state dict, the shape in the current module is {p.shape}"
                )
                continue
            p.data = new
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        unexpected_keys[:] = [k for k in unexpected_keys if k not in own]

    def extra_repr(self) -> str:
        parts = []
        for name, p in self.__dict__.get("_text_parameters", {}).items():
            if p is not None:
                parts.append(f"{name}={p.data!r}")
        return ", ".join(parts)


class TLayer(TModule):
    """A text module with a trainable prompt: ``forward(x) = activation(prompt + x)``.

    ``prompt + x`` fills the prompt's placeholders with ``x`` when it has any and prepends it
    otherwise (broadcasting: a ``[P, 1]`` prompt against ``[N]`` inputs gives ``[P, N]``). The
    optional ``activation`` is any text module, typically an LLM.

    Args:
        prompt: the prompt template(s), stored as a :class:`~langtorch.TextParameter`; ``None``
            for a layer without a prompt.
        activation: a module applied to the filled prompt (e.g. ``langtorch.nn.LLM(...)``).
        trainable: whether the prompt may be changed by optimizers (``requires_grad``).

    Example:
        >>> import langtorch as lt
        >>> layer = lt.TLayer([["Define {}"], ["Explain {}"]])
        >>> layer(lt.TextTensor(["entropy", "gravity"])).shape
        (2, 2)
    """

    def __init__(
        self,
        prompt: Any = None,
        activation: nn.Module | Callable[[TextTensor], TextTensor] | None = None,
        *,
        trainable: bool = True,
    ):
        super().__init__()
        if prompt is not None:
            self.prompt = TextParameter(prompt, requires_grad=trainable)
        else:
            self.register_text_parameter("prompt", None)
        if activation is not None and not callable(activation):
            raise TypeError(f"activation must be a module or callable, got {type(activation).__name__}")
        if activation is not None and not isinstance(activation, nn.Module):
            activation = TFunction(activation)
        self.activation = activation

    def forward(self, x: Any) -> TextTensor:
        x = x if isinstance(x, TextTensor) else TextTensor(x, template=False)
        out = self.prompt + x if self.prompt is not None else x
        return self.activation(out) if self.activation is not None else out


class TFunction(TModule):
    """Wrap a plain function ``TextTensor -> TextTensor`` as a module (used by :class:`TChain`).

    Example:
        >>> import langtorch as lt
        >>> lt.TFunction(lambda t: t.map(str.strip))(lt.TextTensor([" a "])).tolist()
        ['a']
    """

    def __init__(self, fn: Callable[[TextTensor], TextTensor]):
        super().__init__()
        if not callable(fn):
            raise TypeError(f"TFunction needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def forward(self, x: Any) -> Any:
        return self.fn(x)

    def extra_repr(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


class TChain(TModule, nn.Sequential):
    """A sequential chain of text modules (a ``torch.nn.Sequential``); plain functions are
    wrapped in :class:`TFunction`.

    Example:
        >>> import langtorch as lt
        >>> chain = lt.TChain(lt.TLayer("Q: {}"), lambda t: t.map(str.upper))
        >>> chain(lt.TextTensor(["why?"])).tolist()
        ['Q: WHY?']
    """

    def __init__(self, *modules: Any):
        if len(modules) == 1 and isinstance(modules[0], dict):
            items = {k: _as_module(v, k) for k, v in modules[0].items()}
            super().__init__(OrderedDict(items))
        else:
            super().__init__(*(_as_module(m, i) for i, m in enumerate(modules)))


# functional_call's substitutions: id(TextParameter) -> value, for the running context only.
_overrides: contextvars.ContextVar[dict[int, Any] | None] = contextvars.ContextVar(
    "langtorch_parameter_overrides", default=None)


@contextlib.contextmanager
def override_parameters(values: Iterable[tuple[TextParameter, Any]]) -> Iterator[None]:
    """Within the block, a module attribute holding one of these TextParameters reads as the
    value paired with it, on top of any outer override; the parameters themselves do not change.

    The substitution lives in a context variable: it is seen by this thread or task (and by the
    tasks and ``contextvars.copy_context()`` runs it starts), not by others, and ends with the
    block. This is the mechanism under :func:`langtorch.func.functional_call`.

    Args:
        values: ``(parameter, value)`` pairs; a value is what the attribute then returns.

    Example:
        >>> import langtorch as lt
        >>> layer = lt.TLayer("Q: {}")
        >>> with override_parameters([(layer.prompt, lt.TextTensor("Question: {}"))]):
        ...     layer(lt.TextTensor("why?")).item()
        'Question: why?'
        >>> str(layer.prompt)
        'Q: {}'
    """
    pairs = list(values)
    bad = next((p for p, _ in pairs if not isinstance(p, TextParameter)), None)
    if bad is not None:
        raise TypeError(f"override_parameters: pairs (TextParameter, value) expected, got a "
                        f"{type(bad).__name__} as a parameter")
    token = _overrides.set({**(_overrides.get() or {}), **{id(p): v for p, v in pairs}})
    try:
        yield
    finally:
        _overrides.reset(token)


def _child_name(parent: Any, child: Any) -> str | None:
    """The dotted name under which ``parent`` holds ``child``: an attribute, or a path through
    plain containers (``nn.ModuleList`` / ``nn.ModuleDict`` / ``nn.Sequential``), e.g.
    ``"layers.1"``; ``None`` when it does not hold it."""
    level = [("", parent)]
    while level:
        nxt = []
        for prefix, m in level:
            for name, sub in m.__dict__.get("_modules", {}).items():
                if sub is None:
                    continue
                dotted = f"{prefix}{name}"
                if sub is child:
                    return dotted
                if not isinstance(sub, TModule):  # look inside containers, not other text modules
                    nxt.append((dotted + ".", sub))
        level = nxt
    return None


def _as_module(m: Any, where: Any) -> nn.Module:
    if isinstance(m, nn.Module):
        return m
    if callable(m):
        return TFunction(m)
    raise TypeError(f"TChain item {where!r} must be a module or a callable, got {type(m).__name__}")

