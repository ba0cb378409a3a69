"""Under torch.compile, spartune's linears are rewritten before Inductor lowers them: linears
that read the same x (q/k/v, gate/up) run as one SpMM on their weights stacked by rows
(`merge_siblings`; outputs split by views), and the activation and the residual add that follow
a linear run in its fused epilogue: `h + ffn_out(gelu(ffn_in(h)))` becomes two sparse kernels
and nothing else.

Why: a model's forward calls F.gelu (or silu, relu) and adds the residual itself, so each is a
separate pass over the layer's output, which the sparse kernel could have written already
(BERT-base 8x512, compiled: GELU alone was 286 us of a 1961 us forward; benchmarks/LOG.md).
Inductor cannot fuse into an operator it does not see inside, so an Inductor pre-grad pass
rewrites the traced graph before it lowers it:
  act(linear(x, ...))          -> linear(x, ..., activation=act)     (act: gelu, gelu tanh, silu, relu)
  act(view(linear(x, ...)))    -> view(linear(x, ..., activation=act))   (views, reshapes, permutes
                                  between: a pointwise convolution's positions-to-image view, a head split)
  linear(x, ...) + r, r + ...  -> linear(x, ..., residual=r)        (no bias; the add right after)
Only where the rewrite keeps the meaning (the fused epilogue rounds once, at the end, so it
differs from the unfused ops by their intermediate rounding): the linear's output has no other
user, no gradient is recorded through it or the residual (the fused activation has no
backward), shapes, dtypes and layouts match with no broadcasting, and the residual is the add
directly after the linear (nothing can change r in between). A residual is
left alone after a linear with a bias: where the tuner falls back to cuBLAS, bias and residual
together cost a pass of their own, while Inductor folds the add into the next norm for free.

The merge pays where small calls are launch- and ramp-bound (Llama decode N = 8: 2.13x ->
2.7x over compiled dense); it keeps a stacked copy of the parts (formats.stack.stacked: the
merged layers' sparse weight twice in memory, made again when a part changes).

Under torch.autocast, layers call spartune::linear_cast (their weights' low-precision copies);
the passes treat it as a linear and keep its cast: siblings, each casting x itself, merge into a
stack of the copies, epilogues fuse past the autocast region each layer runs in, and a
convolution's prologue fuses where the layer's cast of x changes nothing (the convolution ran in
that dtype under the same autocast).

The pass installs itself when a spartune operator is traced (importing Inductor's config costs
~1 s, not paid by eager users); a pre-grad pass the user set (one, or a list) runs after it.
Set SPARTUNE_FUSE_EPILOGUES=0 to leave graphs alone (no merge, no fusion).
"""
from __future__ import annotations

import functools
import hashlib
import json
import operator
import os
from pathlib import Path

import torch

from .formats.stack import stackable

_ACTIVATIONS = {torch._C._nn.gelu: "gelu", torch._C._nn.silu: "silu", torch.relu: "relu",  # F.gelu is _nn.gelu
                torch.nn.functional.relu: "relu", torch.nn.functional.silu: "silu"}
_ADDS = (operator.add, torch.add)
# ops that only rearrange elements: an elementwise activation commutes with them
_LAYOUT_METHODS = {"view", "reshape", "permute", "transpose", "flatten", "unflatten", "squeeze", "unsqueeze",
                   "contiguous"}
_LAYOUT_FUNCTIONS = {torch.reshape, torch.permute, torch.transpose, torch.flatten, torch.unflatten, torch.squeeze,
                     torch.unsqueeze}
# spartune::linear(x, weight, spec, bias, activation, residual, scale, out_dtype)
_BIAS_ARG, _ACTIVATION_ARG, _RESIDUAL_ARG, _NUM_ARGS = 3, 4, 5, 8


def _value(node):
    """The example tensor Dynamo traced for a node, or None."""
    v = getattr(node, "meta", {}).get("example_value")
    return v if isinstance(v, torch.Tensor) else None


def _calls(node, methods=(), functions=()) -> bool:
    """Whether node calls a Tensor method named in `methods` or one of `functions`."""
    return ((node.op == "call_method" and node.target in methods)
            or (node.op == "call_function" and node.target in functions))


def _is_linear(node) -> bool:
    """A spartune::linear, linear_nograd or linear_cast call as the operator's schema writes it
    (positional arguments only; linear_cast's are linear's and then its `cast`)."""
    if node.op != "call_function" or node.kwargs:
        return False
    linear, nograd, cast = _LINEAR_OPS()
    wanted = _NUM_ARGS + 1 if node.target is cast else _NUM_ARGS
    return node.target in (linear, nograd, cast) and len(node.args) == wanted


def _cast_of(node):
    """The dtype a linear_cast call runs its weight in (torch.autocast), else None."""
    return node.args[_NUM_ARGS] if len(node.args) > _NUM_ARGS else None


@functools.cache
def _LINEAR_OPS() -> tuple:  # noqa: N802 (a constant, read once the operators exist)
    ops = torch.ops.spartune
    return ops.linear.default, ops.linear_nograd.default, ops.linear_cast.default


def _activation_after(linear):
    """(activation node, its epilogue name, the node it reads) when linear's output reaches one
    activation through a chain of layout ops, each the only user of the one before; else None.
    An in-place activation qualifies too: nothing else sees the tensor it overwrites."""
    node = linear
    while len(node.users) == 1:
        user = next(iter(node.users))
        if _calls(user, _LAYOUT_METHODS, _LAYOUT_FUNCTIONS) and user.args and user.args[0] is node:
            node = user
            continue
        name = _activation_name(user)
        return (user, name, node) if name is not None and user.args[0] is node else None
    return None


def _activation_name(node):
    """The epilogue name of an activation call on one tensor (in place or not), else None."""
    name = _ACTIVATIONS.get(node.target) if node.op == "call_function" else None
    if name is None or len(node.args) != 1:
        return None
    kwargs = dict(node.kwargs)
    kwargs.pop("inplace", None)
    if name == "gelu":
        name = {"none": "gelu", "tanh": "gelu_tanh"}.get(kwargs.pop("approximate", "none"))
    return name if not kwargs else None


def _residual_of(add, linear):
    """The other operand of `add` when it is linear's output plus a tensor of the same shape and
    dtype, else None."""
    if add.op != "call_function" or add.target not in _ADDS or add.kwargs or len(add.args) != 2:
        return None
    a, b = add.args
    other = b if a is linear else a if b is linear else None
    if not isinstance(other, torch.fx.Node) or other is linear:
        return None
    mine, theirs, total = _value(linear), _value(other), _value(add)
    if mine is None or theirs is None or total is None:
        return None
    same = theirs.shape == mine.shape == total.shape and theirs.dtype == mine.dtype == total.dtype
    plain = theirs.layout == torch.strided and theirs.device == mine.device and not theirs.requires_grad
    return other if same and plain else None


def fuse_epilogues(graph: torch.fx.Graph) -> int:
    """Rewrite the graph in place; returns how many activations and residuals were fused."""
    order = {node: i for i, node in enumerate(graph.nodes)}  # erasing nodes keeps the others' order
    fused = 0
    for node in list(graph.nodes):
        if not _is_linear(node):
            continue
        out = _value(node)
        if out is None or out.requires_grad:
            continue
        args = node.args
        found = _activation_after(node) if args[_ACTIVATION_ARG] is None and args[_RESIDUAL_ARG] is None else None
        if found is not None:
            user, name, read = found
            args = _absorb(graph, node, user, _ACTIVATION_ARG, name, read)
            fused += 1
        if args[_RESIDUAL_ARG] is None and args[_BIAS_ARG] is None and len(node.users) == 1:
            user = next(iter(node.users))
            residual = _residual_of(user, node) if user is _next_op(node) else None
            if residual is not None and order[residual] < order[node]:
                _absorb(graph, node, user, _RESIDUAL_ARG, residual)
                fused += 1
    return fused


_AUTOCAST_MARKS = (torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast)


def _next_op(node):
    """The node after `node`, past autocast's region marks (a SparseLinear under autocast runs in
    a region of its own: they change no tensor)."""
    after = node.next
    while after.op == "call_function" and after.target in _AUTOCAST_MARKS:
        after = after.next
    return after


def _source(x):
    """What makes linears siblings: x, or (its input, dtype) where x is a cast `x.to(dtype)`
    (under autocast each layer casts x itself)."""
    if (_calls(x, {"to"}) and len(x.args) == 2 and not x.kwargs and isinstance(x.args[0], torch.fx.Node)
            and isinstance(x.args[1], torch.dtype)):
        return x.args[0], x.args[1]
    return x


def _absorb(graph, node, user, index: int, value, read=None) -> tuple:
    """The linear takes over `user` (which reads the linear's output, directly or as `read`):
    `value` goes into the linear's argument `index`, the user's uses become `read`'s, and the
    user leaves the graph. Returns the new arguments."""
    node.args = (*node.args[:index], value, *node.args[index + 1:])
    user.replace_all_uses_with(node if read is None else read)
    graph.erase_node(user)
    return node.args


def merge_siblings(graph: torch.fx.Graph) -> int:
    """Linears that read the same x, with no epilogue but a bias (all or none), one format kind
    and K (`formats.stack.stackable`), become one spartune::linear_stacked call whose output
    columns are split back by views (torch.narrow); returns how many calls were removed."""
    groups: dict[tuple, list] = {}
    for node in graph.nodes:
        if not _is_linear(node):
            continue
        x, weight, spec, bias, activation, residual, scale, out_dtype = node.args[:_NUM_ARGS]  # noqa: F841 (x: the key)
        out = _value(node)
        inputs = [*weight, *([bias] if bias is not None else [])]
        if (activation is not None or residual is not None or scale != 1.0 or out is None or out.requires_grad
                or not all(isinstance(t, torch.fx.Node) and t.op in ("placeholder", "get_attr") for t in inputs)
                or not all(_views_keep_columns(user, out.shape[-1]) for user in node.users)
                or any(user.op == "output" for user in node.users)):  # a returned output stays its own
            continue
        fmt = json.loads(spec)["format"]
        groups.setdefault((_source(x), out_dtype, bias is None, fmt, _cast_of(node)), []).append(node)
    removed = 0
    order = {node: i for i, node in enumerate(graph.nodes)}
    for (_, out_dtype, no_bias, _, cast), members in groups.items():
        if len(members) < 2 or not stackable([m.args[2] for m in members]):
            continue
        # x (or a weight) may change between two members; where each casts x itself, between the
        # first cast and the last member (the first member's cast stands for all)
        first = min(order[m.args[0]] for m in members) if len({m.args[0] for m in members}) > 1 else order[members[0]]
        between = [n for n in graph.nodes if order.get(n, -1) > first and order.get(n, 1 << 62) < order[members[-1]]]
        if any(_mutates(n) for n in between):
            continue
        x = members[0].args[0]  # itself a slice when an earlier group held it
        with graph.inserting_before(members[0]):
            merged = graph.call_function(torch.ops.spartune.linear_stacked.default, (
                x, [t for m in members for t in m.args[1]], [m.args[2] for m in members],
                [len(m.args[1]) for m in members], [] if no_bias else [m.args[3] for m in members], out_dtype, cast))
            start = 0
            for m in members:
                width = json.loads(m.args[2])["shape"][0]
                part = graph.call_function(torch.narrow, (merged, -1, start, width))
                part.meta.update(m.meta)
                m.replace_all_uses_with(part)
                start += width
        for m in members:
            cast_x = m.args[0]
            graph.erase_node(m)
            if cast_x is not x and not cast_x.users:  # another member's own cast of x
                graph.erase_node(cast_x)
        removed += len(members) - 1
    return removed


def fuse_prologues(graph: torch.fx.Graph) -> int:
    """A linear whose x is a convolution's output passed through the convolution's bias and an
    activation (MobileNet: depthwise 3x3, its folded batch norm, ReLU, then the pointwise
    SparseConv2d) becomes spartune::linear_prologue: the convolution runs without its bias and
    the sparse kernel applies act(x + bias) to x's tiles as it loads them, so the pass that
    wrote act(conv + bias) back is gone. Returns how many linears were rewritten."""
    fused = 0
    for node in list(graph.nodes):
        if not _is_linear(node) or _value(node) is None or _value(node).requires_grad:
            continue
        found = _biased_producer(node.args[0])
        if found is None:
            continue
        conv, bias, act, name = found
        conv.args = (*conv.args[:2], None, *conv.args[3:])
        if act is not None:
            act.replace_all_uses_with(act.args[0])
            graph.erase_node(act)
        with graph.inserting_before(node):
            merged = graph.call_function(torch.ops.spartune.linear_prologue.default,
                                         (node.args[0], bias, name, *node.args[1:]))
        merged.meta.update(node.meta)
        node.replace_all_uses_with(merged)
        graph.erase_node(node)
        fused += 1
    return fused


_CONVOLUTIONS = (torch.conv2d, torch.nn.functional.conv2d)


def _biased_producer(x):
    """(convolution, its bias, activation node or None, activation name) when x is
    act(conv(..., bias)) through layout ops that leave the channels as x's last dimension,
    each node the only user of the one before and x read by the linear alone; else None."""
    node, act, name, chain = x, None, None, []
    while len(node.users) == 1:
        if (_calls(node, _LAYOUT_METHODS, _LAYOUT_FUNCTIONS) and node.args and isinstance(node.args[0], torch.fx.Node)
                or _same_dtype_cast(node)):
            chain.append(node)
        elif act is None and _activation_name(node) is not None and isinstance(node.args[0], torch.fx.Node):
            act, name = node, _activation_name(node)
        else:
            break
        node = node.args[0]
    conv = node
    if not (len(conv.users) == 1 and conv.op == "call_function" and conv.target in _CONVOLUTIONS
            and not conv.kwargs and len(conv.args) >= 3 and isinstance(conv.args[2], torch.fx.Node)):
        return None
    out, bias = _value(conv), _value(conv.args[2])
    if out is None or bias is None or out.requires_grad or bias.dim() != 1:  # (no_grad: a Parameter is fine)
        return None
    if not _channels_end_last(conv, chain, x):
        return None
    return conv, conv.args[2], act, name


def _same_dtype_cast(node) -> bool:
    """x.to(dtype) where x has that dtype already (it returns x itself): linear_cast's cast of a
    convolution's output that autocast ran in the same dtype, or a model's own no-op cast."""
    if _source(node) is node:
        return False
    before, after = _value(node.args[0]), _value(node)
    return before is not None and after is not None and before.dtype == after.dtype


def _channels_end_last(conv, chain, x) -> bool:
    """Whether the convolution's channel dimension (1) is x's last after the layout ops (listed
    from x back): permutes and transposes move it; a view or reshape keeps it only if it is
    last on both sides (a row-major reshape keeps the index modulo the last size)."""
    out = _value(conv)
    channels, pos = out.shape[1], 1
    for op in reversed(chain):
        before, after = _value(op.args[0]), _value(op)
        if before is None or after is None:
            return False
        name = op.target if op.op == "call_method" else op.target.__name__
        args = op.args[1:]
        if name == "permute":
            dims = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
            dims = [d % before.dim() for d in dims]
            pos = dims.index(pos)
        elif name == "transpose":
            d0, d1 = (d % before.dim() for d in args)
            pos = d1 if pos == d0 else d0 if pos == d1 else pos
        elif name in ("contiguous", "to"):  # (a cast in the chain changes no dtype: _same_dtype_cast)
            continue
        elif pos == before.dim() - 1 and after.dim() > 0 and after.shape[-1] == channels:
            pos = after.dim() - 1
        else:
            return False
    value = _value(x)
    return value is not None and pos == value.dim() - 1 and value.shape[-1] == channels


# ops whose output views their input (strides carried over), and the two that need strides to fit
_VIEW_METHODS = {"unsqueeze", "squeeze", "transpose", "permute", "expand", "select", "narrow", "t", "unflatten",
                 "split", "chunk", "__getitem__", "view", "view_as", "as_strided"}
_VIEW_FUNCTIONS = {operator.getitem, torch.transpose, torch.permute, torch.unsqueeze, torch.squeeze, torch.select,
                   torch.narrow, torch.split, torch.chunk, torch.Tensor.view, torch.Tensor.view_as}
_VIEW = ({"view"}, {torch.Tensor.view})
_VIEW_AS = ({"view_as"}, {torch.Tensor.view_as})


def _reaches_view(node) -> bool:
    """Whether a `.view` or `view_as` is reached from node through view ops."""
    if _calls(node, *_VIEW) or _calls(node, *_VIEW_AS):
        return True
    return _calls(node, _VIEW_METHODS, _VIEW_FUNCTIONS) and any(_reaches_view(u) for u in node.users)


def _mutates(node) -> bool:
    """An in-place op (a name ending in _, a setitem): it may change what a later member reads."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return node.op in ("call_method", "call_function") and (
        (isinstance(name, str) and name.endswith("_") and not name.endswith("__")) or node.target is operator.setitem)


def _views_keep_columns(user, width: int) -> bool:
    """A `.view` of a column slice is valid only if it splits the last dimension alone (the
    leading dimensions may merge or split freely); other users take any strides, except a
    `.view` (or `view_as`) reached through another view, which is refused."""
    if _calls(user, *_VIEW_AS):
        return False
    if not _calls(user, *_VIEW):
        return not _calls(user, _VIEW_METHODS, _VIEW_FUNCTIONS) or not any(_reaches_view(u) for u in user.users)
    shape = getattr(_value(user), "shape", None)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return False
    tail = 1
    for d in reversed(shape):
        tail *= d
        if tail == width:
            return True
        if tail > width:
            return False
    return False


def _memory_policy() -> str:
    from .dispatch import memory_policy

    return memory_policy()


@functools.lru_cache(maxsize=None)
def _pass_type():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class EpilogueFusion(CustomGraphPass):
        """Ours, then the passes that were set before (one, a list or none)."""

        def __init__(self, then=None):
            self.then = list(then) if isinstance(then, (list, tuple)) else [] if then is None else [then]

        def __call__(self, graph: torch.fx.Graph) -> None:
            if _memory_policy() != "lean":  # a stack is a second copy of the merged weights
                merge_siblings(graph)
            fuse_epilogues(graph)
            fuse_prologues(graph)
            for other in self.then:
                other(graph)

        def uuid(self):
            """None (Inductor then does not cache the graph) when a pass of theirs has no uuid:
            its effect could not be told apart in the cache key."""
            theirs = [getattr(other, "uuid", lambda: None)() for other in self.then]
            if any(u is None for u in theirs):
                return None
            return (hashlib.sha256(Path(__file__).read_bytes()).hexdigest(), _memory_policy(), *theirs)

    # a module-level name, so Inductor can pickle it into its cache keys
    EpilogueFusion.__qualname__ = "EpilogueFusion"
    globals()["EpilogueFusion"] = EpilogueFusion
    return EpilogueFusion


def install() -> None:
    """Put the pass first among Inductor's pre-grad passes unless it is there (the traced
    operators call this on every trace: a config restored or replaced since gets it again)."""
    if os.environ.get("SPARTUNE_FUSE_EPILOGUES", "1") == "0":
        return
    import torch._inductor.config as inductor  # imported already by torch.compile: a lookup

    kind = _pass_type()
    if not isinstance(inductor.pre_grad_custom_pass, kind):
        inductor.pre_grad_custom_pass = kind(inductor.pre_grad_custom_pass)
