"""A transformers causal LM's head and loss, split along the tokens in eager training.

A ``*ForCausalLM``'s forward runs its base model (``model.<base_model_prefix>``), then its own
head: the output embedding, the model's post-processing of the logits (Gemma 2's soft capping,
Granite's scaling, Cohere's logit scale) and its loss (``model.loss_function``: cross-entropy
over the shifted labels, ``ignore_index``, divided by ``num_items_in_batch`` when given). remat
runs that same head code a chunk of tokens at a time (:mod:`remat.eager.chunked`): the model's
own forward is called with its base model stood in for by the chunk's hidden states, the shifted
labels of the chunk (``shift_labels``) and ``num_items_in_batch=1`` (the chunk's sum), and the
sum over chunks is divided as transformers divides. So whatever the model does between its
hidden states and its loss is what runs, and a check at the first call holds the model to it: on
a few tokens, the loss its forward returns must be the summed cross-entropy of the logits it
returns (a model whose loss is something else keeps its own head, with a warning).

A step whose head is chunked returns no logits (``outputs.logits`` is None, as with Liger-Kernel's
fused loss); the loss and its gradients are the model's. ``head=False`` in
:func:`remat.checkpoint` keeps the model's own head.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import torch
import torch.nn.functional as F

from .chunked import chunked_loss
from .plan import Point

HEAD = "<head>"
"""The step planner's name for the head (beside the blocks' module names)."""

CHUNK_OPS = 40
"""Op calls one chunk runs (the head, the loss, their gradients, the accumulation), each at the
profile's fixed per-op seconds."""

CHUNKS = (1, 2, 4, 8, 16, 32, 64)
"""The chunk counts the planner may give the head (one chunk: the loss's gradients taken in the
forward, nothing split)."""

MIN_CHUNK = 16
"""The fewest tokens a chunk holds: below it a chunk's fixed cost outweighs the logits it spares."""


class _Outputs:
    """The base model's output as the head's code reads it: ``last_hidden_state`` (also ``[0]``)
    is the given hidden states; every other field is ``base``'s (None without one)."""

    def __init__(self, hidden: torch.Tensor, base=None) -> None:
        self.last_hidden_state = hidden
        self._base = base

    def __getattr__(self, name):
        if name.startswith("__") or name == "_base":
            raise AttributeError(name)
        return getattr(self._base, name, None) if self._base is not None else None

    def __getitem__(self, k):
        if k in (0, "last_hidden_state"):
            return self.last_hidden_state
        raise KeyError(k)

    def to_tuple(self):
        return (self.last_hidden_state,)


class _Stub(torch.nn.Module):
    def __init__(self, hidden: torch.Tensor, base=None) -> None:
        super().__init__()
        self.hidden = hidden
        self.base = base
        self.called = 0

    def forward(self, *args, **kwargs):
        self.called += 1
        return _Outputs(self.hidden, self.base)


def _reason(model) -> str | None:
    """Why remat cannot chunk ``model``'s head, or None."""
    prefix = getattr(model, "base_model_prefix", None)
    if not prefix or not isinstance(getattr(model, prefix, None), torch.nn.Module):
        return "not a transformers model with a base model"
    if not hasattr(model, "loss_function"):
        return "it has no loss_function"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        return "its output embedding is not a torch.nn.Linear"
    return None


def find_causal_lm(model: torch.nn.Module) -> "LMHead | None":
    """The head of ``model`` when it is (or wraps, as peft's models do) a transformers causal LM
    whose head remat can chunk, else None."""
    names = _causal_lm_classes()
    for m in (model, *(c for _, c in model.named_modules())):
        causal = any(c.__name__.endswith("ForCausalLM") or c.__name__ in names for c in type(m).__mro__)
        if causal and _reason(m) is None:
            return LMHead(m)
    return None


def _causal_lm_classes() -> set:
    """The class names transformers' ``AutoModelForCausalLM`` builds (``GPT2LMHeadModel`` too)."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # pragma: no cover - transformers missing or moved
        return set()
    out = set()
    for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        out.update(v if isinstance(v, (tuple, list)) else (v,))
    return out


class LMHead:
    """The head of one transformers causal LM, chunked by remat (see the module's text)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.prefix = model.base_model_prefix
        self.linear = model.get_output_embeddings()
        self.vocab = int(self.linear.out_features)
        self.width = int(self.linear.in_features)
        seen: dict = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            # the head's own parameters, the output embedding tied to the input one included
            if not name.startswith(self.prefix + ".") or id(p) in {id(q) for q in self.linear.parameters()}:
                seen[id(p)] = p
        self._head_params = list(seen.values())
        self.checked: str | None = None  # None: not yet; "" held; else why not
        self.frontiers: dict = {}
        self.last_chunk: int | None = None

    # -- what remat plans ----------------------------------------------------------------------
    def params(self) -> list:
        return [p for p in self._head_params if p.requires_grad]

    def frontier(self, n_tokens: int, dtype: torch.dtype, profile) -> list[Point]:
        """The head's points for ``n_tokens`` tokens: unchunked first (what the model's own head
        holds: the hidden states its linear saves and every token's fp32 log-probabilities; at
        its backward's start 12 bytes a logit, as a chunk's; the logits themselves are dropped
        with the output before the backward, as a training loop that reads ``.loss`` does), then chunked in
        :data:`CHUNKS` parts (the gradient of the hidden states held from the forward to the
        backward; one chunk's logits, log-probabilities and their gradients, 12 bytes a logit
        measured in bf16 and fp32, live at once with the chunk's gradient of the weights), no
        smaller than where a chunk's logits would hold less than the weights' gradient (or the
        hidden states, for a frozen head). A chunked point's time is what its chunks add to the
        unchunked head's (:meth:`_seconds`)."""
        key = (n_tokens, str(dtype))
        if key in self.frontiers:
            return self.frontiers[key]
        a = torch.empty((), dtype=dtype).element_size()
        nh, nv = n_tokens * self.width * a, n_tokens * self.vocab
        grads = sum(p.numel() * p.element_size() for p in self.params())
        unchunked = Point(frozenset(), nh + 4 * nv, nh + 12 * nv, 0.0,
                          unwrapped=True, label="unchunked")
        pts = [unchunked]
        own = self._seconds(n_tokens, n_tokens, a, profile)
        floor = max(grads, nh)
        for n in CHUNKS:
            chunk = -(-n_tokens // n)
            if n > 1 and (chunk < MIN_CHUNK or 12 * chunk * self.vocab < floor):
                break  # a smaller chunk spares less than the weights' gradient (or the hidden states) hold
            transient = 12 * chunk * self.vocab + 2 * chunk * self.width * a + grads
            pts.append(Point(frozenset(), nh, nh + transient,
                             max(self._seconds(n_tokens, chunk, a, profile) - own, 0.0), label=f"chunked {chunk}"))
        self.frontiers[key] = pts
        return pts

    def _seconds(self, n_tokens: int, chunk: int, a: int, profile) -> float:
        """Predicted seconds of the head and its gradient over ``n_tokens`` in chunks of ``chunk``:
        per chunk its three matmuls at the rate the profile's curve gives one of that size (a
        thin matmul runs far below the peak), its 12 bytes a logit moved, and its op calls' fixed
        cost."""
        if profile is None:
            return 0.0
        total, left = 0.0, n_tokens
        while left > 0:
            c = min(chunk, left)
            flops = 2.0 * c * self.width * self.vocab
            moved = 12.0 * c * self.vocab + 3.0 * c * self.width * a
            total += 3 * flops / profile.rate(flops) + moved / profile.moved_rate(moved) + CHUNK_OPS * profile.op_fixed
            left -= c
            if left > 0 and left % chunk == 0:  # the rest are whole chunks like this one
                total += (left // chunk) * (3 * flops / profile.rate(flops) + moved / profile.moved_rate(moved)
                                            + CHUNK_OPS * profile.op_fixed)
                break
        return total

    # -- the check -----------------------------------------------------------------------------
    def check(self, kwargs: dict) -> str:
        """``""`` when the model's own head, run on a few tokens of stand-in hidden states, returns
        the summed cross-entropy of the logits it returns; else why not."""
        if self.checked is not None:
            return self.checked
        w = self.linear.weight
        t = 6
        with torch.no_grad(), torch.random.fork_rng(devices=[w.device] if w.device.type == "cuda" else []):
            h = torch.randn(1, t, self.width, dtype=w.dtype, device=w.device)
            labels = (torch.arange(t, device=w.device) * 7 % self.vocab).reshape(1, t)
            labels[0, 1] = -100
            try:
                out, called = self._run(h, labels, **_head_kwargs(kwargs))
            except Exception as e:  # noqa: BLE001 - any failure keeps the model's own head
                self.checked = f"its forward fails on chunked hidden states ({type(e).__name__}: {e})"
                return self.checked
            logits = getattr(out, "logits", None)
            loss = getattr(out, "loss", None)
            if not called:
                self.checked = f"its forward does not call its base model model.{self.prefix}"
            elif logits is None or loss is None or tuple(logits.shape) != (1, t, self.vocab):
                self.checked = "its forward does not return logits of every token and a loss"
            else:
                want = F.cross_entropy(logits.float().reshape(-1, self.vocab), labels.reshape(-1),
                                       ignore_index=-100, reduction="sum")
                ok = torch.allclose(loss.float(), want, rtol=1e-4, atol=1e-4 * float(want.abs()) + 1e-5)
                self.checked = "" if ok else ("its loss is not the cross-entropy of its logits "
                                              f"({float(loss):.6g} against {float(want):.6g} on a check)")
        return self.checked

    def _run(self, h: torch.Tensor, shift: torch.Tensor, base=None, *, summed: bool = True, **kwargs):
        """The model's own forward with its base model stood in for by ``h`` (and ``base``'s other
        outputs); ``summed``: the loss summed over the tokens (``num_items_in_batch=1``, labels
        ``shift`` already shifted), else as the caller's ``kwargs`` ask. Returns the output and
        whether the base model was called."""
        model, stub = self.model, _Stub(h, base)
        old = model._modules[self.prefix]
        model._modules[self.prefix] = stub
        try:
            extra = {"labels": shift, "shift_labels": shift, "num_items_in_batch": 1} if summed else {}
            out = type(model).forward(model, use_cache=False, return_dict=True, **{**kwargs, **extra})
        finally:
            model._modules[self.prefix] = old
        return out, stub.called

    # -- the step ------------------------------------------------------------------------------
    def loss(self, hidden: torch.Tensor, labels: torch.Tensor, kwargs: dict, chunk: int) -> torch.Tensor:
        """The model's loss over ``hidden`` (the base model's last hidden states) and ``labels``
        (or ``kwargs["shift_labels"]``), ``chunk`` tokens at a time."""
        ignore = kwargs.get("ignore_index", -100)
        shift = kwargs.get("shift_labels")
        if shift is None:
            shift = F.pad(labels, (0, 1), value=ignore)[..., 1:]
        flat = shift.reshape(1, -1).to(hidden.device)
        items = kwargs.get("num_items_in_batch")
        divisor = (flat != ignore).sum() if items is None else items
        rest = _head_kwargs(kwargs)

        def loss_of(h, sl):
            out, _ = self._run(h, flat[:, sl], **rest)
            return out.loss

        self.last_chunk = chunk
        return chunked_loss(loss_of, hidden, params=self.params(), chunk=chunk, divisor=divisor)

    def auxiliary(self, hidden: torch.Tensor, base_out, kwargs: dict):
        """The model's own output on one token whose label is ignored, with the base model's
        other outputs (an MoE's router logits): its loss is the part of the model's loss that
        does not depend on the logits (the load-balancing loss, zero for most models), its
        fields the model's output type."""
        ignore = kwargs.get("ignore_index", -100)
        one = hidden[..., :1, :] if hidden.dim() == 3 else hidden.reshape(1, -1, hidden.shape[-1])[:, :1]
        shift = torch.full(one.shape[:-1], ignore, dtype=torch.long, device=hidden.device)
        rest = _head_kwargs(kwargs)
        if getattr(base_out, "router_logits", None) is not None:
            rest["output_router_logits"] = True
        out, _ = self._run(one, shift, base_out, **rest)
        return out


_NOT_FOR_HEAD = ("labels", "shift_labels", "num_items_in_batch", "use_cache", "return_dict", "logits_to_keep",
                 "input_ids", "inputs_embeds", "attention_mask", "position_ids", "past_key_values", "cache",
                 "cache_position", "output_hidden_states", "output_attentions", "token_type_ids",
                 "output_router_logits")


def _head_kwargs(kwargs: dict) -> dict:
    """The call's keyword arguments the head's code may read (the loss's, e.g. ``ignore_index``),
    without those the chunked call sets itself or that only the base model reads; an MoE's
    auxiliary loss is off (it is added once, by :meth:`LMHead.auxiliary`)."""
    out = {k: v for k, v in kwargs.items() if k not in _NOT_FOR_HEAD}
    out["output_router_logits"] = False
    return out


_HEAD_ONLY = ("labels", "shift_labels", "logits_to_keep", "return_dict", "ignore_index")


def _bound(model, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by name (positional ones bound to the forward's parameters)."""
    if not args:
        return dict(kwargs)
    sig = inspect.signature(type(model).forward)
    bound = sig.bind_partial(model, *args, **kwargs).arguments
    out = {}
    for name, value in bound.items():
        kind = sig.parameters[name].kind
        if name == next(iter(sig.parameters)):
            continue
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            out[name] = value
    return out


def _logits_dtype(weight: torch.Tensor) -> torch.dtype:
    dev = weight.device.type
    try:
        if torch.is_autocast_enabled(dev):
            return torch.get_autocast_dtype(dev)
    except (TypeError, RuntimeError):  # pragma: no cover - a device autocast does not know
        pass
    return weight.dtype


def chunked_forward(planner, head: LMHead, original, *args, **kwargs):
    """The causal LM's forward with its head planned by ``planner``: chunked along the tokens
    when the plan says so, else the model's own (``original``, which also runs every call that
    is not a training step with labels: eval, ``torch.no_grad()``, generation)."""
    model = head.model
    call = _bound(model, args, kwargs)
    labels = call.get("labels")
    keep = call.get("logits_to_keep", 0)
    if (labels is None or not model.training or not torch.is_grad_enabled() or planner.budget is None
            or keep not in (0, None)):
        return original(*args, **kwargs)
    why = head.check(call)
    if why:
        planner.head_unsupported(why)
        return original(*args, **kwargs)
    n_tokens = int(labels.numel())
    planner.plan_head(head.frontier(n_tokens, _logits_dtype(head.linear.weight), planner.head_profile()))
    base_kwargs = {k: v for k, v in call.items() if k not in _HEAD_ONLY}
    base_kwargs["return_dict"] = True
    base = getattr(model, head.prefix)
    base_out = base(**base_kwargs)
    hidden = base_out.last_hidden_state if hasattr(base_out, "last_hidden_state") else base_out[0]
    point = planner.choice.get(HEAD)
    planner.enter_head()
    try:
        if point is None or point.unwrapped:  # the model's own head, on the base model's outputs
            out, _ = head._run(hidden, labels, base_out, summed=False,
                               **{k: v for k, v in call.items() if k not in _NOT_FOR_HEAD or k in (
                                   "labels", "shift_labels", "num_items_in_batch", "output_router_logits")})
            head.last_chunk = None
        else:
            chunk = int(point.label.split()[-1])
            loss = head.loss(hidden, labels, call, chunk)
            template = head.auxiliary(hidden, base_out, call)
            if template.loss is not None and getattr(base_out, "router_logits", None) is not None:
                loss = loss + template.loss
            fields = {f.name: getattr(base_out, f.name, None) for f in dataclasses.fields(type(template))
                      if f.name not in ("loss", "logits")}
            if getattr(template, "aux_loss", None) is not None:
                fields["aux_loss"] = template.aux_loss
            out = type(template)(loss=loss, logits=None, **fields)
    finally:
        planner.exit_head()
    if call.get("return_dict") is False:
        return out.to_tuple()
    return out


def install(planner) -> None:
    """Give the planner's causal LM the planned head: its ``forward`` (an instance attribute, as
    remat's block wrappers) runs :func:`chunked_forward`, showing the model's own signature
    (transformers' Trainer keeps only the dataset columns the forward's signature names)."""
    head = planner.head
    if head is None:
        return
    lm = head.model
    original = lm.forward
    fn = functools.partial(chunked_forward, planner, head, original)
    wrapped = functools.wraps(original)(lambda *args, **kwargs: fn(*args, **kwargs))
    wrapped.__signature__ = inspect.signature(original)
    wrapped._remat_head = True
    lm.forward = wrapped


def uninstall(planner) -> None:
    """Undo :func:`install`."""
    if planner.head is not None and getattr(planner.head.model.__dict__.get("forward"), "_remat_head", False):
        del planner.head.model.__dict__["forward"]


__all__ = ["HEAD", "LMHead", "chunked_forward", "install", "uninstall"]
