"""The torch.compile pass that moves an activation and a residual add into a spartune linear's
epilogue: what it fuses, what it must leave alone (other users, broadcasting, dtype changes,
gradients, a residual that may change in between), and that outputs equal eager's."""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from spartune import dispatch, fusion
from spartune.nn import SparseLinear

TOL = dict(atol=1e-5, rtol=1e-5)  # fp32


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/nn/conftest.py


def sparse(m, k, requires_grad=False, bias=True):
    lin = nn.Linear(k, m, bias=bias)
    lin.requires_grad_(requires_grad)
    return SparseLinear.from_linear(lin, "csr", 0.5)


def fused_graph(fn, *args):
    """fn compiled by a backend that runs the pass on Dynamo's graph: (output, fusions, the
    spartune linear calls' (activation, has residual))."""
    seen = {}

    def backend(gm, inputs):
        seen["fused"] = fusion.fuse_epilogues(gm.graph)
        gm.recompile()
        seen["calls"] = [(n.args[4], n.args[5] is not None) for n in gm.graph.nodes
                         if n.target in (torch.ops.spartune.linear.default, torch.ops.spartune.linear_nograd.default)]
        return gm.forward

    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return out, seen["fused"], seen["calls"]


def check(fn, *args, fused, calls):
    torch.manual_seed(1)
    expect = fn(*args)
    out, n, found = fused_graph(fn, *args)
    assert (n, found) == (fused, calls)
    torch.testing.assert_close(out, expect, **TOL)


@pytest.mark.parametrize("act, name", [(F.gelu, "gelu"), (lambda t: F.gelu(t, approximate="tanh"), "gelu_tanh"),
                                       (F.silu, "silu"), (F.relu, "relu"), (torch.relu, "relu"),
                                       (nn.GELU(), "gelu"), (nn.SiLU(), "silu")])
def test_activation_fused(act, name):
    lin = sparse(24, 16)
    with torch.no_grad():
        check(lambda x: act(lin(x)), torch.randn(2, 5, 16), fused=1, calls=[(name, False)])


def test_activation_fused_through_layout_ops():
    """A reshape or permute between the linear and the activation (SparseConv2d's pixels back to
    an image, an attention head split) does not stop the fusion; an in-place activation fuses."""
    lin = sparse(16, 16, bias=False)
    with torch.no_grad():
        check(lambda x: F.relu(lin(x).view(2, 2, 16).permute(1, 0, 2), inplace=True), torch.randn(4, 16), fused=1,
              calls=[("relu", False)])
        check(lambda x: F.silu(torch.transpose(lin(x).reshape(2, 2, 4, 4), 1, 2)), torch.randn(4, 16), fused=1,
              calls=[("silu", False)])


def test_sparse_pointwise_convolution_and_its_relu_fused():
    from spartune.nn import SparseConv2d

    conv = SparseConv2d.from_conv(nn.Conv2d(8, 16, 1), "csr", 0.5)
    block = nn.Sequential(conv, nn.ReLU(inplace=True))
    x = torch.randn(2, 8, 3, 5).to(memory_format=torch.channels_last)
    with torch.no_grad():
        check(block, x, fused=1, calls=[("relu", False)])


@pytest.mark.parametrize("side", ["left", "right"])
def test_residual_and_activation_fused(side):
    up, down = sparse(48, 16), sparse(16, 48, bias=False)

    def ffn(h):
        y = down(F.gelu(up(h)))
        return h + y if side == "left" else y + h

    with torch.no_grad():
        check(ffn, torch.randn(3, 4, 16), fused=2, calls=[("gelu", False), (None, True)])


def test_left_alone_where_not_exact():
    lin = sparse(16, 16, bias=False)
    x = torch.randn(4, 16)
    with torch.no_grad():
        check(lambda x: (lambda y: F.relu(y) * y)(lin(x)), x, fused=0, calls=[(None, False)])  # two users
        check(lambda x: lin(x) + torch.ones(16), x, fused=0, calls=[(None, False)])  # broadcast
        check(lambda x: lin(x) + x.double(), x, fused=0, calls=[(None, False)])  # the add changes dtype
        check(lambda x: (lambda v: F.relu(v) + v)(lin(x).view(2, 2, 16)), x, fused=0, calls=[(None, False)])
        check(lambda x: (lambda y: (F.relu(y, inplace=True), y * 2)[1])(lin(x)), x, fused=0, calls=[(None, False)])
        with_bias = sparse(16, 16)
        check(lambda x: x + with_bias(x), x, fused=0, calls=[(None, False)])  # see fusion's docstring

        def mutated_between(x):
            y = lin(x)
            x.mul_(2)  # the residual changes after the linear: reading it there would be wrong
            return x + y

        out, n, _ = fused_graph(mutated_between, x.clone())
        assert n == 0
        torch.testing.assert_close(out, mutated_between(x.clone()), **TOL)


def test_no_fusion_when_gradients_are_recorded():
    lin = sparse(16, 16, requires_grad=True)
    x = torch.randn(4, 16)
    out, n, _ = fused_graph(lambda x: x + F.gelu(lin(x)), x)
    assert n == 0
    out.sum().backward()
    assert lin.weight_values.grad is not None


def test_installed_by_torch_compile_with_inductor(monkeypatch):
    """The default backend runs the pass (installed when the operator is traced) and keeps a
    pass the user set before."""
    import torch._inductor.config as inductor

    seen = []

    class Theirs:
        def __call__(self, graph):
            seen.append("theirs")

        def uuid(self):
            return "theirs"

    counted = []
    real = fusion.fuse_epilogues
    monkeypatch.setattr(fusion, "fuse_epilogues", lambda g: counted.append(real(g)) or counted[-1])
    up, down = sparse(32, 16), sparse(16, 32, bias=False)
    h = torch.randn(2, 3, 16)
    # no cache: a cached graph skips the passes (they ran when it was made)
    with torch.no_grad(), inductor.patch(pre_grad_custom_pass=Theirs(), force_disable_caches=True):
        out = torch.compile(lambda h: h + down(F.silu(up(h))))(h)
        torch.testing.assert_close(out, h + down(F.silu(up(h))), **TOL)
    assert counted == [2] and seen == ["theirs"]


def test_a_residual_that_needs_its_gradient_is_left_alone():
    """r + gelu(lin(x)) with lin frozen and r requiring grad: fusing both would mark the output
    non-differentiable (the fused activation has no backward) and drop r's gradient."""
    lin = sparse(16, 16, bias=False)
    x, r = torch.randn(4, 16), torch.randn(4, 16, requires_grad=True)
    out, n, calls = fused_graph(lambda x, r: r + F.gelu(lin(x)), x, r)
    assert (n, calls) == (1, [("gelu", False)])
    out.sum().backward()
    torch.testing.assert_close(r.grad, torch.ones_like(r))


def test_chains_the_users_passes_and_keys_the_cache_by_them():
    kind = fusion._pass_type()
    ran = []

    def plain(graph):  # no uuid: the graph must not be cached under a key blind to it
        ran.append("plain")

    class Keyed:
        def __call__(self, graph):
            ran.append("keyed")

        def uuid(self):
            return "keyed"

    graph = torch.fx.Graph()
    kind([Keyed(), plain])(graph)
    assert ran == ["keyed", "plain"]
    assert kind([Keyed(), plain]).uuid() is None
    assert kind(Keyed()).uuid()[2:] == ("keyed",) and kind(None).uuid()
    assert kind(None).uuid()[1] == dispatch.memory_policy()  # lean merges no siblings: keyed apart


# --- linears that read the same x, as one SpMM ---------------------------------------------------------

def qkv(pattern="block:16", bias=True):
    torch.manual_seed(3)
    return [SparseLinear.from_linear(nn.Linear(64, 64, bias=bias), pattern, 0.5) for _ in range(3)]


def attention(q, k, v):
    def fn(h):
        b, t, d = h.shape
        heads = lambda y: y.view(b, t, 4, 16).transpose(1, 2)  # noqa: E731 (splits the last dim only)
        a = F.scaled_dot_product_attention(heads(q(h)), heads(k(h)), heads(v(h)))
        return a.transpose(1, 2).reshape(b, t, d)
    return fn


def merged_graph(fn, *args):
    seen = {}

    def backend(gm, inputs):
        seen["removed"] = fusion.merge_siblings(gm.graph)
        gm.recompile()
        seen["stacked"] = sum(n.target is torch.ops.spartune.linear_stacked.default for n in gm.graph.nodes)
        return gm.forward

    return torch.compile(fn, backend=backend, fullgraph=True)(*args), seen["removed"], seen["stacked"]


@pytest.mark.parametrize("pattern, bias", [("block:16", True), ("csr", False)])
def test_siblings_run_as_one(pattern, bias):
    fn = attention(*qkv(pattern, bias))
    h = torch.randn(2, 5, 64)
    with torch.no_grad():
        out, removed, calls = merged_graph(fn, h)
        torch.testing.assert_close(out, fn(h), **TOL)
    assert (removed, calls) == (2, 1)


def test_siblings_left_alone_where_merging_would_change_the_program():
    q, k, v = qkv()
    h = torch.randn(2, 5, 64)
    with torch.no_grad():
        flat = lambda h: q(h).view(2, 5 * 64) + k(h).view(2, 5 * 64)  # noqa: E731 (folds the last dim)
        assert merged_graph(flat, h)[1:] == (0, 0)
        csr = SparseLinear.from_linear(nn.Linear(64, 64), "csr", 0.5)
        assert merged_graph(lambda h: q(h) + csr(h), h)[1:] == (0, 0)  # two formats
        assert merged_graph(lambda h: q(h, activation="relu") + k(h), h)[1:] == (0, 0)  # an epilogue
        assert merged_graph(lambda h: q(h) + k(h * 2), h)[1:] == (0, 0)  # different inputs
    grad = [SparseLinear.from_linear(nn.Linear(64, 64), "csr", 0.5, ) for _ in range(2)]
    for layer in grad:
        layer.weight_values.requires_grad_(True)
    assert merged_graph(lambda h: grad[0](h) + grad[1](h), h)[1:] == (0, 0)


def test_the_compiled_model_follows_its_weights():
    """The stacked copy is made again when a part's values change (load_state_dict, an optimizer
    step): the compiled model never runs stale weights."""
    q, k, v = qkv()
    fn = attention(q, k, v)
    h = torch.randn(2, 5, 64)
    compiled = torch.compile(fn, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(h), fn(h), **TOL)
        k.weight_values.mul_(3)
        v.bias.add_(1)
        torch.testing.assert_close(compiled(h), fn(h), **TOL)


def test_merged_calls_keep_their_stacked_copy():
    """The stacked copy is made once per group (a layer in two groups included) and not on
    every call; the model does not recompile; parameters are left where they were (views taken
    before still alias them); training around a no_grad compiled call still back-propagates."""
    from unittest import mock

    from spartune.formats import stack

    q, k, v = qkv()
    h, g = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    fn = lambda h, g: q(h) + k(h) + q(g) + v(g)  # noqa: E731 (groups (q, k) and (q, v))
    before = q.weight_values.detach()
    compiled = torch.compile(fn, fullgraph=True)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True), \
            mock.patch.object(stack, "stack_rows", wraps=stack.stack_rows) as builds:
        torch.testing.assert_close(compiled(h, g), fn(h, g), **TOL)
        assert builds.call_count == 2
        compiled(h, g)
        assert builds.call_count == 2
        state = {name: t.clone() for name, t in k.state_dict().items()}
        k.weight_values.mul_(-1)
        torch.testing.assert_close(compiled(h, g), fn(h, g), **TOL)
        k.load_state_dict(state)
        torch.testing.assert_close(compiled(h, g), fn(h, g), **TOL)
    assert before.data_ptr() == q.weight_values.data_ptr()
    loss = q(h).sum()  # a training forward, then a merged no_grad call, then its backward
    with torch.no_grad():
        compiled(h, g)
    loss.backward()
    assert q.weight_values.grad is not None


def test_siblings_review_cases():
    """From a review of the first version: chained groups, x changed in place between members,
    views reached through other views, returned outputs."""
    torch.manual_seed(4)
    qa, kva, kb, vb = (SparseLinear.from_linear(nn.Linear(64, 64), "block:16", 0.5) for _ in range(4))
    h = torch.randn(2, 5, 64)
    with torch.no_grad():
        def chained(h):  # kv is a slice of the first group and the x of the second
            a, kv = qa(h), kva(h)
            return a + kb(kv) + vb(kv)

        out, removed, calls = merged_graph(chained, h)
        torch.testing.assert_close(out, chained(h), **TOL)
        assert (removed, calls) == (2, 2)

        def mutated(h):
            a = qa(h)
            h.mul_(2)
            return a + kb(h)

        out, removed, _ = merged_graph(mutated, h.clone())
        assert removed == 0
        torch.testing.assert_close(out, mutated(h.clone()), **TOL)
        for fn in (lambda h: qa(h).unsqueeze(-1).view(2, 320) + kb(h).reshape(2, 320),
                   lambda h: qa(h)[0].view(-1) + kb(h)[0].reshape(-1),
                   lambda h: qa(h).view_as(torch.empty(2, 320)) + kb(h).reshape(2, 320),
                   lambda h: (qa(h), kb(h))):
            torch._dynamo.reset()
            out, removed, _ = merged_graph(fn, h)
            assert removed == 0


# --- a convolution's bias and activation, applied as the sparse kernel loads x -----------------------

def prologue_graph(fn, *args):
    """fn compiled with the epilogue then the prologue pass: (output, prologues fused, whether a
    convolution still carries its bias)."""
    seen = {}

    def backend(gm, inputs):
        fusion.fuse_epilogues(gm.graph)
        seen["fused"] = fusion.fuse_prologues(gm.graph)
        gm.recompile()
        seen["biased"] = any(n.target is torch.conv2d and n.args[2] is not None for n in gm.graph.nodes)
        return gm.forward

    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return out, seen["fused"], seen["biased"]


def separable(pattern="block:16", act=nn.ReLU(inplace=True), channels=16):
    """MobileNet's block: depthwise 3x3 with bias, activation, pointwise SparseConv2d (+ ReLU)."""
    from spartune.nn import SparseConv2d

    torch.manual_seed(4)
    depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
    pointwise = SparseConv2d.from_conv(nn.Conv2d(channels, 32, 1), pattern, 0.5)
    return nn.Sequential(depthwise, *([act] if act is not None else []), pointwise, nn.ReLU(inplace=True))


@pytest.mark.parametrize("pattern", ["block:16", "csr"])
@pytest.mark.parametrize("act", [nn.ReLU(inplace=True), nn.ReLU(), nn.SiLU(), None], ids=["relu_", "relu", "silu", "none"])
def test_a_convolutions_bias_and_activation_move_into_the_linear(pattern, act):
    block = separable(pattern, act)
    x = torch.randn(2, 16, 5, 6).to(memory_format=torch.channels_last)
    with torch.no_grad():
        expect = block(x.clone())
        out, fused, biased = prologue_graph(block, x)
    assert (fused, biased) == (1, False)
    torch.testing.assert_close(out, expect, **TOL)


def test_prologue_left_alone_where_not_exact():
    """The convolution's output read twice, the channels not x's last dimension (a linear over
    the image's width, equal to the channel count here), gradients recorded: nothing moves."""
    block = separable()
    depthwise, pointwise = block[0], block[2]
    x = torch.randn(2, 16, 5, 6).to(memory_format=torch.channels_last)
    width = SparseLinear.from_linear(nn.Linear(16, 8), "block:16", 0.5)
    read_twice = lambda x: (lambda y: pointwise(F.relu(y)) + y.sum())(depthwise(x))  # noqa: E731
    with torch.no_grad():
        out, fused, biased = prologue_graph(read_twice, x)
        assert (fused, biased) == (0, True)
        torch.testing.assert_close(out, read_twice(x), **TOL)
    wide = torch.randn(2, 16, 5, 16).to(memory_format=torch.channels_last)  # W == C
    over_width = lambda x: width(F.relu(depthwise(x)))  # noqa: E731 (a linear over W, not C)
    with torch.no_grad():
        out, fused, biased = prologue_graph(over_width, wide)
        assert (fused, biased) == (0, True)
        torch.testing.assert_close(out, over_width(wide), **TOL)
        moved = lambda x: width(F.relu(depthwise(x)).permute(0, 2, 1, 3))  # noqa: E731 (still W last)
        out, fused, biased = prologue_graph(moved, wide)
        assert (fused, biased) == (0, True)
        torch.testing.assert_close(out, moved(wide), **TOL)
    depthwise.requires_grad_(True)
    out, fused, biased = prologue_graph(block, x)
    assert (fused, biased) == (0, True)


def test_lean_memory_merges_no_siblings(monkeypatch):
    """A merged stack is a second copy of its layers' weights: the lean policy runs them apart."""
    merged = []
    monkeypatch.setattr(fusion, "merge_siblings", lambda graph: merged.append(graph))
    for policy, runs in (("speed", 1), ("lean", 0)):
        monkeypatch.setattr(dispatch, "_memory", policy)
        merged.clear()
        fusion._pass_type()(None)(torch.fx.Graph())
        assert len(merged) == runs, policy


def test_under_autocast_the_passes_keep_the_cast():
    """A float32 model compiled under torch.autocast calls linear_cast (the weights' fp16 copies):
    siblings still merge (their stack made of the copies, the biases cast) and an activation and a
    residual still fuse, and the output is eager autocast's."""
    q, k, v = qkv("csr", bias=True)
    up, down = sparse(96, 64), sparse(64, 96, bias=False)
    attend = attention(q, k, v)

    def block(h):
        a = attend(h)
        return a + down(F.silu(up(a)))

    seen = {}

    def backend(gm, inputs):
        fusion._pass_type()(None)(gm.graph)
        gm.recompile()
        nodes = list(gm.graph.nodes)
        seen["stacked"] = [n.args[-1] for n in nodes if n.target is torch.ops.spartune.linear_stacked.default]
        seen["cast"] = [(n.args[4], n.args[5] is not None, n.args[8]) for n in nodes
                        if n.target is torch.ops.spartune.linear_cast.default]
        return gm.forward

    h = torch.randn(2, 5, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        expect = block(h)
        out = torch.compile(block, backend=backend, fullgraph=True)(h)
    assert seen == {"stacked": [torch.float16],
                    "cast": [("silu", False, torch.float16), (None, True, torch.float16)]}
    assert out.dtype == expect.dtype == torch.float16
    torch.testing.assert_close(out.float(), expect.float(), atol=2e-3, rtol=2e-3)
    # the stack is made of the layers' fp16 copies, once: a second call finds it
    from spartune.formats import stack

    copies = [m.weight.__dict__["_autocast_torch.float16"][1] for m in (q, k, v)]
    made = stack._stacks[copies[0]][tuple(map(id, copies))]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        again = torch.compile(block, backend=backend, fullgraph=True)(h)
    assert stack._stacks[copies[0]] == {tuple(map(id, copies)): made}
    torch.testing.assert_close(again, out)


def test_installed_by_torch_compile_under_autocast_too(monkeypatch):
    """A model whose layers only call linear_cast (a float32 model under autocast) still gets the
    pass from Inductor: its siblings merge and its residual fuses."""
    import torch._inductor.config as inductor

    counts = {}
    for name in ("merge_siblings", "fuse_epilogues"):
        real = getattr(fusion, name)
        monkeypatch.setattr(fusion, name, lambda g, real=real, name=name: counts.setdefault(name, real(g)))
    gate, up, down = sparse(48, 16, bias=False), sparse(48, 16, bias=False), sparse(16, 48, bias=False)
    block = lambda h: h + down(F.silu(gate(h)) * up(h))  # noqa: E731
    h = torch.randn(2, 3, 16, dtype=torch.float16)  # (an fp32 h would make the residual's sum fp32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16), inductor.patch(
            pre_grad_custom_pass=None, force_disable_caches=True):
        out = torch.compile(block, fullgraph=True)(h)
        expect = block(h)
    assert counts == {"merge_siblings": 1, "fuse_epilogues": 1}
    torch.testing.assert_close(out, expect, atol=2e-3, rtol=2e-3)


def test_siblings_casting_x_apart_are_left_alone_when_one_cast_is_changed():
    """Siblings keyed by x's source (each reads its own h.to(fp16)) merge on the first one's cast:
    an in-place edit of that cast (or of h) before the first sibling must stop the merge."""
    q, k = (SparseLinear.from_linear(nn.Linear(16, 8), "csr", 0.5).half() for _ in range(2))

    def edited_cast(h):
        xa = h.to(torch.float16)
        xa.mul_(2)
        return q(xa) * 1, k(h.to(torch.float16)) * 1

    def edited_source(h):
        xa = h.to(torch.float16)
        h.mul_(2)
        return q(xa) * 1, k(h.to(torch.float16)) * 1

    for fn in (edited_cast, edited_source):
        h = torch.randn(3, 16)
        with torch.no_grad():
            out, removed, calls = merged_graph(fn, h.clone())
            expect = fn(h.clone())
        assert (removed, calls) == (0, 0), fn.__name__
        for got, want in zip(out, expect):
            torch.testing.assert_close(got, want, **TOL)
    with torch.no_grad():  # and with no edit they merge
        plain = lambda h: (q(h.to(torch.float16)) * 1, k(h.to(torch.float16)) * 1)  # noqa: E731
        assert merged_graph(plain, torch.randn(3, 16))[1:] == (1, 1)


def test_siblings_of_a_model_built_under_inference_mode_merge():
    """Inference tensors have no version counter: the stacked copy is keyed by address alone."""
    with torch.inference_mode():
        fn = attention(*qkv("csr", bias=True))
        h = torch.randn(2, 5, 64)
        out, removed, calls = merged_graph(fn, h)
        torch.testing.assert_close(out, fn(h), **TOL)
    assert (removed, calls) == (2, 1)


@pytest.mark.parametrize("pattern", ["block:16", "csr"])
def test_under_autocast_a_convolutions_prologue_moves_into_linear_cast(pattern):
    """A float32 separable block under autocast: the convolution runs in fp16, so the pointwise
    layer's cast of x changes nothing and the bias and ReLU move into its linear (fp32 bias read
    as it is); the output is eager autocast's within fp16 rounding. Where the cast does change
    x's dtype (the convolution run outside autocast), nothing moves."""
    block = separable(pattern)
    x = torch.randn(2, 16, 5, 6).to(memory_format=torch.channels_last)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        expect = block(x.clone())
        out, fused, biased = prologue_graph(block, x)
    assert (fused, biased) == (1, False)
    assert out.dtype == expect.dtype == torch.float16
    torch.testing.assert_close(out.float(), expect.float(), rtol=2e-2, atol=2e-2)
    depthwise, pointwise = block[0], block[2]

    def fp32_convolution(x):
        with torch.autocast("cpu", enabled=False):
            h = F.relu(depthwise(x))
        return pointwise(h)

    torch._dynamo.reset()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        out, fused, biased = prologue_graph(fp32_convolution, x)
        torch.testing.assert_close(out.float(), fp32_convolution(x).float(), rtol=2e-2, atol=2e-2)
    assert (fused, biased) == (0, True)


def test_only_a_plain_cast_to_x_own_dtype_is_seen_through():
    """The prologue pass looks through x.to(dtype) only where it returns x itself: a cast that
    changes the dtype, or one spelled with more arguments (copy=, a device, dtype=), stops it."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.empty(2, 3, dtype=torch.float16)

    def cast(*args, result=torch.float16, **kwargs):
        node = graph.call_method("to", (x, *args), kwargs)
        node.meta["example_value"] = torch.empty(2, 3, dtype=result)
        return node

    assert fusion._same_dtype_cast(cast(torch.float16))
    assert not fusion._same_dtype_cast(cast(torch.float32, result=torch.float32))
    assert not fusion._same_dtype_cast(cast(torch.float16, copy=True))
    assert not fusion._same_dtype_cast(cast(dtype=torch.float16))
    assert not fusion._same_dtype_cast(cast("cpu", torch.float16))
    assert not fusion._same_dtype_cast(cast(torch.float16, False, True))
