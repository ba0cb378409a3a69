"""sparsify(model): prune a model's linear layers (and pointwise convolutions) into sparse
formats, all of them or none.

What real models hold and a naive swap breaks: nn.Linear subclasses (converted when they keep
nn.Linear's forward), nn.MultiheadAttention (whose projections F.multi_head_attention_forward
reads as raw tensors: it becomes a SparseMultiheadAttention first), fused Transformer fast
paths (switched off where a weight is sparse), and tied weights (pruned once and shared; a tie
to a module that is not a linear layer is left dense, since pruning would break it).
"""
from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass
from typing import Callable

from torch import nn

from .. import dispatch
from ..prune import parse_pattern
from .attention import PROJECTIONS, SparseMultiheadAttention, disable_fused_fast_paths
from .conv import not_pointwise, sparse_pointwise_class
from .linear import SparseLinear


_SHARED = "its weight is shared with another module: pruning would break the tie"


@dataclass(frozen=True)
class LayerReport:
    """What sparsify did (or, in a dry run, would do) to one layer."""

    name: str
    shape: tuple[int, int]  # (out_features, in_features)
    pattern: str | None  # None: left dense (see `skipped`)
    sparsity: float = 0.0  # achieved fraction of zeros
    retained: float = 1.0  # ||pruned|| / ||w||: the weight magnitude kept
    dense_bytes: int = 0
    sparse_bytes: int = 0  # the format's tensors (values and indices)
    predicted_speedup: float = 1.0  # cost model: dense time / best time at `tokens`
    predicted_backend: str = "dense"
    skipped: str = ""  # why the layer stays dense


def sparsify(model: nn.Module, pattern, sparsity: float | None = None, *,
             filter_fn: Callable[[str, nn.Module], bool] | None = None, dry_run: bool = False,
             tokens: int = 2048) -> dict[str, LayerReport]:
    """Replace, in place, the linear layers of `model` by SparseLinear layers and its pointwise
    (kernel size 1) convolutions by SparseConv2d / SparseConv1d layers, pruned by magnitude; the
    transposed linear layers of Hugging Face GPT-2-style models (transformers' Conv1D: x @ W + b)
    become SparseLinear layers too. Returns a LayerReport per linear layer and convolution
    (skipped ones, depthwise and spatial convolutions among them, say why).

    `pattern`: one pattern for all ("block:64", "csr", "2:4", ...); or a dict from layer-name
    globs ("*.mlp.*", matched against the whole name as `model.named_modules()` gives it) to a
    pattern or (pattern, sparsity), first match wins, unmatched layers stay dense; or a callable
    (name, module) -> pattern, (pattern, sparsity) or None.
    `sparsity`: the fraction of zeros (0.9 keeps a tenth; the CLI's --density is the fraction
    kept), for every pattern that takes one; N:M and V:N:M fix their own (2:4: 0.5), so with one
    such pattern for all leave it None, and in rules a global sparsity passes them by. Rules that
    match no layer, a call that converts none, and layers whose blocks cannot meet the sparsity
    asked (block:64 on a 64 x 64 layer) warn.
    `filter_fn(name, module)` picks layers further. `dry_run=True` changes nothing and reports
    what would happen, with the cost model's predicted speedup at `tokens` tokens and the
    memory of each layer. A layer that fails to convert raises, naming it, and leaves the model
    as it was: every layer is built before any is swapped in. To hold the model near its pruned
    size on the GPU (no dense or library copies where those run faster), call
    `spartune.set_memory_policy("lean")` before running it.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"sparsify: model must be an nn.Module, got {type(model).__name__}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"sparsify: tokens must be a positive int, got {tokens!r}")
    plan = _plan(model, pattern, sparsity, filter_fn)
    _warn_unmatched(pattern, plan)
    again = [n for n, (m, _, _) in plan.items() if isinstance(m, SparseLinear)]
    if again:
        warnings.warn(f"sparsify: {len(again)} layer(s) asked for are already sparse and stay as they are "
                      f"({', '.join(again[:3])}{', ...' if len(again) > 3 else ''}): see their reports", stacklevel=2)
    reports, replacements, made = {}, {}, {}  # made: id(dense weight) -> (name, SparseLinear, bias)
    missed = []  # layers whose blocks could not meet the sparsity asked
    attention = {}  # MultiheadAttention name -> its SparseMultiheadAttention
    for name, (module, choice, skipped) in plan.items():
        if isinstance(module, SparseLinear):  # asked for, already sparse: said, not silently kept
            w = module.weight
            dense_bytes = w.shape[0] * w.shape[1] * w.values.element_size()
            reports[name] = LayerReport(name, tuple(w.shape), None, dense_bytes=dense_bytes, sparse_bytes=w.nbytes,
                                        skipped=skipped)
            continue
        conv = isinstance(module, (nn.Conv1d, nn.Conv2d))
        shape = _shape(module)
        dense_bytes = 0 if nn.parameter.is_lazy(module.weight) else module.weight.numel() * module.weight.element_size()
        if skipped or choice is None:
            reports[name] = LayerReport(name, shape, None, dense_bytes=dense_bytes, sparse_bytes=dense_bytes,
                                        skipped=skipped or "not selected")
            continue
        module = _convertible(model, name, module, attention)
        pat, sp = choice
        tied = made.get(id(module.weight))
        try:
            if tied is not None:  # the same Parameter in two layers: one sparse weight, shared
                first_name, first, first_bias = tied
                layer, fmt_report = first.tied_copy(first.bias if module.bias is first_bias else module.bias), \
                    reports[first_name]
            elif conv:
                layer, fmt_report = sparse_pointwise_class(module).from_conv(module, pat, sp, return_report=True)
            elif is_transposed_linear(module):
                layer, fmt_report = SparseLinear.from_linear(_as_linear(module), pat, sp, return_report=True)
            else:
                layer, fmt_report = SparseLinear.from_linear(module, pat, sp, return_report=True)
                made[id(module.weight)] = (name, layer, module.bias)
        except Exception as e:
            message = f"sparsify: layer {name!r} ({shape[0]}x{shape[1]}) could not be pruned into {pat!r}: {e}"
            try:
                error = type(e)(message)
            except Exception:  # an exception type whose constructor takes other arguments
                error = RuntimeError(message)
            raise error from e
        if sp is not None and not tied and parse_pattern(pat).fixed_density is None \
                and abs(fmt_report.sparsity - sp) > SPARSITY_MISS:
            missed.append(f"{name} ({shape[0]}x{shape[1]}, {pat}): asked {sp:.2f}, got {fmt_report.sparsity:.2f}")
        speedup, backend = dispatch.predicted_speedup(layer.weight, tokens)
        reports[name] = LayerReport(name, shape, fmt_report.pattern, fmt_report.sparsity, fmt_report.retained,
                                    dense_bytes, 0 if tied else layer.weight.nbytes, speedup, backend,
                                    f"tied to {tied[0]}" if tied else "")
        replacements[name] = layer.to(module.weight.device)
    if missed:
        warnings.warn(f"sparsify: {len(missed)} layer(s) miss the sparsity asked, their blocks too coarse for their "
                      f"shape ({'; '.join(missed[:3])}{'; ...' if len(missed) > 3 else ''}): a smaller block or "
                      "filter_fn to leave them dense", stacklevel=2)
    if dry_run:
        return reports
    _swap_in(model, attention, replacements)
    return reports


def _convertible(model, name: str, module: nn.Module, attention: dict) -> nn.Module:
    """The module that a plan's entry converts: an nn.MultiheadAttention's projection is its
    SparseMultiheadAttention's layer (the attention converted once, kept in `attention`)."""
    parent_name, _, child = name.rpartition(".")
    if child in PROJECTIONS and isinstance(_get(model, parent_name), nn.MultiheadAttention):
        if parent_name not in attention:
            attention[parent_name] = SparseMultiheadAttention.from_mha(_get(model, parent_name))
        return getattr(attention[parent_name], child)
    return module


def _swap_in(model, attention: dict, replacements: dict) -> list[tuple[str, nn.Module]]:
    """Put the converted attention modules, then the new layers (name -> layer), into the model,
    under every name a replaced module is held at; switch off the fused fast paths they break.
    Returns (name, module it held) for each name set, in order (what undoes it, set back reversed)."""
    aliases = [n for n, _ in model.named_modules(remove_duplicate=False) if n]  # a module held at several names
    new = {}  # id(module replaced) -> (it, kept alive while ids are compared; its replacement)
    for parent_name, attn in attention.items():  # the attention modules first, their projections next
        for child in PROJECTIONS:
            if f"{parent_name}.{child}" in replacements:
                setattr(attn, child, replacements.pop(f"{parent_name}.{child}"))
        old = _get(model, parent_name)
        new[id(old)] = (old, attn)
    for name, layer in replacements.items():
        old = _get(model, name)
        new[id(old)] = (old, layer)
    done = []
    for name in aliases:  # every name of a replaced module (a shared one too) gets the replacement
        old = _get(model, name)
        if id(old) in new and new[id(old)][0] is old:
            _set(model, name, new[id(old)][1])
            done.append((name, old))
    disable_fused_fast_paths(model)
    return done


def _plan(model, pattern, sparsity, filter_fn) -> dict:
    """name -> (linear or conv module, (pattern, sparsity) or None, reason it is skipped or "")."""
    choose = _chooser(pattern, sparsity)
    owners = {}  # id(weight) -> names of the modules holding it (ties)
    for name, m in model.named_modules():
        for p in m.parameters(recurse=False):
            owners.setdefault(id(p), []).append(name)
    plan = {}
    root = "the model itself is this layer: sparsify replaces submodules in place (wrap it in a module)"
    for name, m in model.named_modules():
        if isinstance(m, nn.MultiheadAttention):
            skip = "" if name else root
            for child, linear in _attention_projections(m).items():
                full = f"{name}.{child}" if name else child
                plan[full] = (linear, *_select(full, linear, choose, filter_fn, skip))
        elif isinstance(m, nn.Linear) and not isinstance(m, SparseLinear) and name not in plan:
            skip = ""
            if not name:
                skip = root
            elif nn.parameter.is_lazy(m.weight):
                skip = "its weight is not initialized yet (a lazy layer): run a forward pass first"
            elif type(m).forward is not nn.Linear.forward:
                skip = f"{type(m).__name__} overrides nn.Linear.forward: converting it would drop its behaviour"
            elif any(not isinstance(model.get_submodule(o), nn.Linear) for o in owners.get(id(m.weight), [])):
                skip = "its weight is tied to a module that is not a linear layer: pruning would break the tie"
            plan[name] = (m, *_select(name, m, choose, filter_fn, skip))
        elif isinstance(m, SparseLinear) and name and _asked_for(name, m, choose, filter_fn):
            plan[name] = (m, None, f"already sparse ({m.weight.signature}): sparsify prunes dense layers; "
                                   "to prune further, build it again from its dense weight (weight.to_dense())")
        elif isinstance(m, (nn.Conv1d, nn.Conv2d)):
            base = sparse_pointwise_class(m).CONV
            skip = ""
            if not name:
                skip = root
            elif not_pointwise(m):
                skip = f"not a pointwise (kernel size 1, stride 1, unpadded, ungrouped) convolution: {not_pointwise(m)}"
            elif nn.parameter.is_lazy(m.weight):
                skip = "its weight is not initialized yet (a lazy layer): run a forward pass first"
            elif type(m).forward is not base.forward:
                skip = f"{type(m).__name__} overrides {base.__name__}.forward: converting it would drop its behaviour"
            elif len(owners.get(id(m.weight), [])) > 1:
                skip = _SHARED
            plan[name] = (m, *_select(name, m, choose, filter_fn, skip))
        elif is_transposed_linear(m):
            base = _transposed_linear_base(m)
            skip = root if not name else ""
            if not skip and type(m).forward is not base.forward:
                skip = f"{type(m).__name__} overrides {base.__name__}.forward: converting it would drop its behaviour"
            elif not skip and len(owners.get(id(m.weight), [])) > 1:
                skip = _SHARED
            plan[name] = (m, *_select(name, m, choose, filter_fn, skip))
    for name, (m, choice, skip) in plan.items():  # a tie is pruned whole or not at all
        off = [o for o in owners.get(id(m.weight), []) if o != name and o in plan and plan[o][1] is None]
        if choice is not None and off:
            plan[name] = (m, None, f"its weight is tied to {off[0]!r}, which is left dense: pruning this layer "
                                   "alone would break the tie")
    return plan


def _transposed_linear_base(m: nn.Module):
    """transformers' Conv1D class when m is one or a subclass (GPT-2 and its kin: despite its name
    a linear layer, x @ W + b with W stored (in_features, out_features)); else None. Recognised by
    name, so that transformers is not imported."""
    for cls in type(m).__mro__:
        if cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers"):
            return cls
    return None


def is_transposed_linear(m: nn.Module) -> bool:
    return (_transposed_linear_base(m) is not None and isinstance(getattr(m, "weight", None), nn.Parameter)
            and m.weight.dim() == 2)


def _linear_over(weight: nn.Parameter, bias) -> nn.Linear:
    """An nn.Linear holding `weight` (out, in) and `bias` as they are: nothing allocated, no RNG
    drawn (built on meta). What SparseLinear.from_linear prunes, and what sparsify plans with."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta", dtype=weight.dtype)
    linear.weight = weight
    if bias is not None:
        linear.bias = bias
    return linear


def _as_linear(m: nn.Module) -> nn.Linear:
    """A transposed linear layer as an nn.Linear over W^T (a view) and its bias."""
    return _linear_over(nn.Parameter(m.weight.detach().T, requires_grad=m.weight.requires_grad), m.bias)


def _shape(m: nn.Module) -> tuple[int, int]:
    """(out_features, in_features) of a layer sparsify may convert."""
    if isinstance(m, (nn.Conv1d, nn.Conv2d)):
        return m.out_channels, m.in_channels
    if is_transposed_linear(m):
        return m.weight.shape[1], m.weight.shape[0]
    return m.out_features, m.in_features


def _attention_projections(mha: nn.MultiheadAttention) -> dict[str, nn.Linear]:
    """MHA's in-projections as linear layers over its raw weight Parameters (the names
    SparseMultiheadAttention gives them), and its out_proj: the layers sparsify prunes once the
    attention is converted. Only their weights are read (the plan, ties, sizes)."""
    if mha._qkv_same_embed_dim:
        weights = {"in_proj": mha.in_proj_weight}
    else:
        weights = {"q_proj": mha.q_proj_weight, "k_proj": mha.k_proj_weight, "v_proj": mha.v_proj_weight}
    packed_bias = mha.in_proj_bias if mha._qkv_same_embed_dim else None  # thirds are not Parameters
    out = {child: _linear_over(w, packed_bias) for child, w in weights.items()}
    return {**out, "out_proj": mha.out_proj}


def _asked_for(name, layer, choose, filter_fn) -> bool:
    """Whether the user's pattern and filter select an already sparse layer (callables written for
    nn.Linear may fail on it: then it was not asked for)."""
    try:
        return _select(name, layer, choose, filter_fn, "")[0] is not None
    except Exception:  # noqa: BLE001
        return False


def _select(name, module, choose, filter_fn, skip):
    if skip:
        return None, skip
    if filter_fn is not None and not filter_fn(name, module):
        return None, ""
    return choose(name, module), ""


def _chooser(pattern, sparsity):
    """(name, module) -> (pattern, sparsity) or None, from sparsify's `pattern` argument."""
    def norm(choice, per_layer: bool = True):
        if choice is None:
            return None
        if isinstance(choice, tuple):
            pat, sp = choice
            parse_pattern(pat)  # a bad pattern fails here, before anything is pruned
            return pat, sp
        # a rule's pattern alone takes the global sparsity, unless the pattern fixes its own (N:M)
        fixed = parse_pattern(choice).fixed_density is not None
        return choice, None if fixed and per_layer else sparsity

    if pattern is None:
        raise TypeError("sparsify: pattern must be a pattern (\"csr\", \"block:64\", \"2:4\", ...), a dict from layer-name "
                        "globs to patterns, or a callable; got None")
    if callable(pattern):
        return lambda name, m: norm(pattern(name, m))
    if isinstance(pattern, dict):
        rules = [(glob, norm(choice)) for glob, choice in pattern.items()]
        return lambda name, m: next((c for glob, c in rules if fnmatch.fnmatchcase(name, glob)), None)
    fixed = norm(pattern, per_layer=False)
    return lambda name, m: fixed


# |achieved - asked| sparsity above which sparsify warns (block patterns on small layers)
SPARSITY_MISS = 0.05


def _warn_unmatched(pattern, plan: dict) -> None:
    """Rules that select nothing, and a call that converts nothing, are said, not silent."""
    names = [n for n in plan if n]
    if isinstance(pattern, dict):
        unmatched = [g for g in pattern if not any(fnmatch.fnmatchcase(n, g) for n in names)]
        if unmatched:
            example = f" (its layers are named like {names[0]!r})" if names else ""
            warnings.warn(f"sparsify: no layer matches {unmatched}: globs match whole names{example}", stacklevel=3)
    if plan and not any(choice is not None and not skipped for _, choice, skipped in plan.values()) \
            and not all(isinstance(m, SparseLinear) for m, _, _ in plan.values()):  # (said already: "already sparse")
        reasons = sorted({skipped for _, _, skipped in plan.values() if skipped})
        why = f": {reasons[0]}" if len(reasons) == 1 else ""
        warnings.warn(f"sparsify: no layer was converted{why} (see the returned reports)", stacklevel=3)


def _get(model, name):
    return model.get_submodule(name) if name else model


def _set(model, name, module):
    parent, _, child = name.rpartition(".")
    setattr(_get(model, parent), child, module)


__all__ = ["sparsify", "LayerReport"]
