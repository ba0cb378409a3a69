"""Shared test helpers: random sparse weights with the structure of each pattern."""
import contextlib

import torch

import spartune as st


def random_mask(rows, cols, density, gen=None):
    return torch.rand(rows, cols, generator=gen) < density


def random_weight(rows, cols, density, dtype=torch.float32, gen=None):
    w = torch.randn(rows, cols, generator=gen).to(dtype)
    return torch.where(random_mask(rows, cols, density, gen), w, torch.zeros((), dtype=dtype))


def block_weight(rows, cols, bm, bk, density, dtype=torch.float32, gen=None):
    br, bc = -(-rows // bm), -(-cols // bk)
    keep = (torch.rand(br, bc, generator=gen) < density).repeat_interleave(bm, 0).repeat_interleave(bk, 1)
    w = torch.randn(rows, cols, generator=gen).to(dtype)
    return torch.where(keep[:rows, :cols], w, torch.zeros((), dtype=dtype))


def pattern_weight(pattern, rows, cols, sparsity=0.8, dtype=torch.float32, gen=None):
    """A dense weight that holds `pattern` exactly, and its format."""
    w = torch.randn(rows, cols, generator=gen).to(dtype)
    p = st.parse_pattern(pattern)
    fmt = st.sparsify_weight(w, p, None if p.fixed_density else sparsity)
    return fmt.to_dense(), fmt


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def inf_column_reference(x, A, row, col):
    """What a sparse kernel owes for x whose (row, col) holds an inf: the float64 reference of x
    with that entry zeroed, and the outputs of that token which multiply it (the rows of A that
    store column col, explicit zeros included, since kernels multiply those too: inf or NaN
    there). Dense float64 would give NaN everywhere (inf x 0)."""
    from spartune import reference as ref

    clean = x.clone()
    clean[row, col] = 0
    return ref.linear(clean, A), A.mask()[:, col].to(x.device)


def random_2to4(rows, cols, dtype=torch.float32, seed=0, least=0):
    """A dense weight that is 2:4 along K: each group of 4 columns keeps between `least` and 2
    random entries (K not a multiple of 4: the last group is cut)."""
    g = torch.Generator().manual_seed(seed)
    groups = -(-cols // 4)
    w = torch.randn(rows, groups * 4, generator=g)
    rank = torch.rand(rows, groups, 4, generator=g).argsort(-1).argsort(-1)
    keep = rank < torch.randint(least, 3, (rows, groups, 1), generator=g)
    return (w.reshape(rows, groups, 4) * keep).reshape(rows, groups * 4)[:, :cols].to(dtype)


def _activations():
    import torch.nn.functional as F

    return {None: lambda v: v, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
            "silu": F.silu}


ACTS = _activations()  # the fused epilogue's activations, by name


def mma_registers(units: torch.Tensor) -> torch.Tensor:
    """What the mma kernel loads of the packing's 512-byte units (..., 256 halves, 8 x 8 core
    matrices): lane (g, t)'s four words at row g's 16 bytes of the 256-byte row halves and the
    128-byte core matrices (spmm_nm.cu; ldmatrix's four matrices give the same) -> (..., 32, 8),
    mma.sp's register order."""
    lane = torch.arange(32)
    word = (lane // 4) * 4 + lane % 4
    halves = torch.stack([2 * (word + off) + e for off in (0, 64, 32, 96) for e in (0, 1)], dim=1)  # (32, 8)
    return units[..., halves.flatten()].reshape(*units.shape[:-1], 32, 8)


def linear_reference(x, w, bias=None, activation=None, residual=None, scale=1.0):
    """act(scale * x @ w^T + bias) + residual in float64: what every linear-layout kernel computes."""
    y = scale * (x.double() @ w.double().T)
    if bias is not None:
        y = y + bias.double()
    y = ACTS[activation](y)
    if residual is not None:
        y = y + residual.double()
    return y


def check_strided_operands(run, A, w, configs, N, dtype, x_view=lambda t, K: t[:, :K], tol=1e-2):
    """A linear-layout kernel on spmm's views (x = X.T and out = Y.T, residual transposed) for
    the first and last config, then on an x with a padded row pitch (`x_view` cuts it from a
    wider tensor) writing a column slice of a wider out, whose other columns stay untouched.
    `run(A, x, config, out=..., **epilogue)` launches the kernel."""
    M, K = w.shape
    x = torch.randn(K, N, device="cuda", dtype=dtype).T
    out_t = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    res = torch.randn(M, N, device="cuda", dtype=dtype).T
    for cfg in (configs[0], configs[-1]):
        out_t.fill_(float("nan"))
        run(A, x, cfg, out=out_t.T, residual=res)
        assert not out_t.isnan().any()
        assert rel_err(out_t.T, linear_reference(x, w, residual=res)) <= tol, cfg
    xp = x_view(torch.randn(N, K + 8, device="cuda", dtype=dtype), K)
    wide = torch.full((N, M + 5), float("nan"), device="cuda", dtype=dtype)
    run(A, xp, configs[0], out=wide[:, 2:2 + M])
    assert rel_err(wide[:, 2:2 + M], linear_reference(xp, w)) <= tol
    assert wide[:, :2].isnan().all() and wide[:, 2 + M:].isnan().all()


def capture(fn):
    """A CUDA graph of fn(), captured on a side stream after the work before it is done (call fn
    once first: compile, pack and allocate outside the capture)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        fn()
    return graph


@contextlib.contextmanager
def fp16_reduced_precision(allowed: bool):
    """torch's fp16 reduced-precision-reduction flag set for a block, then restored whole (the
    public setter would reset its split-K half)."""
    get, set_ = (getattr(torch._C, f"_{op}_cublas_allow_fp16_reduced_precision_reduction", None)
                 for op in ("get", "set"))
    saved = get() if get else torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = allowed
    try:
        yield
    finally:
        if get and set_:
            set_(*saved) if isinstance(saved, tuple) else set_(saved)
        else:
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = saved


def check_bound_launch_with_outputs_held(bind, A, w, config, N, tol, calls=3):
    """A family's bound launch (`bind(A, x, out, config)`) run on new x and out while the earlier
    calls' outs are still held: each call must read its own x and write its own out (a pointer
    or descriptor bound once would make it write the first one again)."""
    M, K = A.shape
    xs = [torch.randn(N, K, device="cuda", dtype=torch.float16) for _ in range(calls)]
    outs = [torch.full((N, M), float("nan"), device="cuda", dtype=torch.float16) for _ in range(calls)]
    bound = bind(A, xs[0], outs[0], config)
    for x, out in zip(xs, outs):
        bound(x, out, None, None)
    for x, out in zip(xs, outs):
        assert not out.isnan().any() and rel_err(out, linear_reference(x, w)) <= tol, config


class GatedMLP(torch.nn.Module):
    """Llama's MLP, scaled down: down(silu(gate(x)) * up(x))."""

    def __init__(self, d=256, hidden=704):
        super().__init__()
        self.gate = torch.nn.Linear(d, hidden, bias=False)
        self.up = torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=True)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def gated_mlp_reference(model, x):
    """A (pruned) GatedMLP in float64, its sparse weights densified."""
    w = {name: m.weight.to_dense().double() for name, m in model.named_children()}
    h = torch.nn.functional.silu(x.double() @ w["gate"].T) * (x.double() @ w["up"].T)
    return h @ w["down"].T + model.down.bias.double()


def finite_rel_err(y, ref):
    """rel_err of an output that must be finite everywhere (an unwritten element usually is not)."""
    assert torch.isfinite(y).all(), "an output element is not finite (unwritten?)"
    return rel_err(y, ref)
