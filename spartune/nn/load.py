"""load_sparse_state_dict(model, state_dict): a sparsified model's checkpoint into a freshly built
dense model. Without it the dense layers refuse the checkpoint (they expect a dense `weight`), and
pruning a random model first only to overwrite it draws and discards a whole model's weights."""
from __future__ import annotations

import json
from collections.abc import Mapping

from torch import nn

from ..formats import format_class
from .conv import _SparsePointwise, sparse_pointwise_class
from .linear import _SPEC_KEY, SparseLinear, _spec_of
from .sparsify import _convertible, _get, _plan, _set, _shape, _swap_in


def load_sparse_state_dict(model: nn.Module, state_dict: dict, *, strict: bool = True):
    """Load `state_dict`, saved from a sparsified model (`model.state_dict()` after sparsify), into
    `model`, a dense model of the same architecture, and return load_state_dict's result.

    Each layer the checkpoint holds sparse becomes sparse first, as sparsify would make it
    (SparseLinear for nn.Linear and transformers' Conv1D, SparseConv1d / SparseConv2d for
    pointwise convolutions, attention as SparseMultiheadAttention, tied weights shared again, on
    the dense layer's device and dtype, trainable as it was); then `model.load_state_dict`
    loads every tensor. Nothing is pruned and no random weight is drawn. Every sparse layer is
    built before the model changes: one the model cannot hold there (another shape, a bias where
    the model has none or the reverse, a layer sparsify would not convert) raises, as does one
    missing a tensor under `strict` (without it, such layers stay as they are and load_state_dict's
    result lists their keys); if load_state_dict then fails on another layer, the model's modules
    are put back as they were. A tied layer
    whose tensors the checkpoint left out (safetensors' save_model keeps one copy) shares the
    first's, as does any tied tensor it left out (transformers' save_pretrained drops a tied
    lm_head). Not in a state_dict, and so not restored: a pointwise convolution's fused activation
    (sparsify makes none).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"load_sparse_state_dict: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(state_dict, Mapping):
        raise TypeError("load_sparse_state_dict: state_dict must map names to tensors (torch.load(path), "
                        f"safetensors.torch.load_file(path)), got {type(state_dict).__name__}")
    saved = [k[: len(k) - len(_SPEC_KEY)] for k in state_dict if k.endswith(_SPEC_KEY)]
    saved = [p for p in saved if _is_spartune_spec(_spec_of(state_dict, p))]
    plan = _plan(model, lambda name, m: "csr", None, None)  # every layer sparsify would convert, and why not
    holders = {}  # id(module) -> its plan name: a module held under several names is converted once
    for name, (module, _, _) in plan.items():
        holders.setdefault(id(module), name)
    state = dict(state_dict)  # (tied layers' tensors filled in where the checkpoint left them out)
    attention, replacements, made = {}, {}, {}  # made: id(dense weight) -> (layer, dense bias)
    # layers with their tensors first, so that a tie missing them finds its first layer built
    for prefix in sorted(saved, key=lambda p: (_absent(state, p) != [], p)):
        name = _planned(model, plan, holders, prefix[:-1])
        if name is None:
            if strict and not _sparse_already(model, prefix[:-1]):
                raise ValueError(f"load_sparse_state_dict: the checkpoint holds a sparse layer {prefix[:-1]!r} that "
                                 "the model has no linear layer or pointwise convolution for")
            continue  # already sparse, or left to load_state_dict's report
        if isinstance(plan[name][0], SparseLinear) or name in replacements:
            continue  # already sparse (load_state_dict loads it), or an alias of a layer built
        module, _, skipped = plan[name]
        if skipped:
            if not strict:
                continue
            raise ValueError(f"load_sparse_state_dict: the checkpoint holds {name!r} sparse, but sparsify would not "
                             f"convert the model's layer there: {skipped}")
        shape = tuple(json.loads(_spec_of(state, prefix))["shape"])
        if shape != _shape(module):
            raise ValueError(f"load_sparse_state_dict: {name!r} is {shape} in the checkpoint "
                             f"and {_shape(module)} (out, in) in the model")
        module = _convertible(model, name, module, attention)
        tied = made.get(id(module.weight))
        if tied is not None:  # the same Parameter in two layers: one sparse weight, shared
            first, first_bias = tied
            shared_bias = module.bias is not None and module.bias is first_bias
            replacements[name] = first.tied_copy(first.bias if shared_bias else module.bias)
            continue
        if (prefix + "bias" in state) != (module.bias is not None):
            if not strict:
                continue
            raise ValueError(f"load_sparse_state_dict: {name!r} has {'a' if module.bias is not None else 'no'} bias "
                             f"in the model and {'one' if prefix + 'bias' in state else 'none'} in the checkpoint")
        absent = _absent(state, prefix)
        if absent:
            if strict:
                raise KeyError(f"load_sparse_state_dict: the checkpoint's sparse layer {prefix[:-1]!r} lacks {absent}")
            continue
        weight = module.weight
        layer = SparseLinear.from_state_dict(state, prefix)
        layer.to(dtype=weight.dtype) if weight.device.type == "meta" else layer.to(weight.device, weight.dtype)
        if isinstance(module, (nn.Conv1d, nn.Conv2d)):
            layer = sparse_pointwise_class(module)(layer.weight, layer.bias)
        linear = layer.linear if isinstance(layer, _SparsePointwise) else layer
        linear.weight_values.requires_grad_(weight.requires_grad)
        if linear.bias is not None and module.bias is not None:
            linear.bias.requires_grad_(module.bias.requires_grad)
        made[id(weight)] = (layer, module.bias)
        replacements[name] = layer
    swapped = _swap_in(model, attention, replacements)
    _fill_ties(model, state)
    try:
        return model.load_state_dict(state, strict=strict)
    except BaseException:  # another layer did not fit: the model's modules as they were
        for name, old in reversed(swapped):
            _set(model, name, old)
        raise


def _fill_ties(model, state: dict) -> None:
    """Keys a checkpoint left out because their tensor is another's in the model (safetensors'
    save_model keeps one copy of tied tensors; transformers' save_pretrained drops a tied
    lm_head): given the present one's tensor."""
    names = {}
    for name, t in model.state_dict(keep_vars=True).items():
        names.setdefault(id(t), []).append(name)
    for group in names.values():
        present = next((n for n in group if n in state), None)
        if present is not None:
            for n in group:
                state.setdefault(n, state[present])


def _planned(model, plan, holders, saved_name):
    """The plan's name of the layer a checkpoint saved under `saved_name` (a pointwise
    convolution's is its `.linear`, where the model has no such module; an alias of a module
    resolves to its first name), or None."""
    parent, _, child = saved_name.rpartition(".")
    convolution = child == "linear" and saved_name not in plan and _module_at(model, saved_name) is None
    for name in [parent] if convolution else [saved_name]:
        if name in plan:
            return holders.get(id(plan[name][0]), name)
        module = _module_at(model, name)
        if module is not None and id(module) in holders:
            return holders[id(module)]
    return None


def _sparse_already(model, saved_name) -> bool:
    """Whether the model already holds that layer sparse (load_state_dict then loads it)."""
    return isinstance(_module_at(model, saved_name), SparseLinear)


def _module_at(model, name):
    try:
        return _get(model, name)
    except AttributeError:
        return None


def _absent(state, prefix) -> list[str]:
    """The weight tensors of the sparse layer saved under `prefix` that the checkpoint lacks."""
    return [prefix + f"weight_{n}" for n in format_class(_spec_of(state, prefix)).tensor_fields()
            if prefix + f"weight_{n}" not in state]


def _is_spartune_spec(spec) -> bool:
    if spec is None:
        return False
    try:
        format_class(spec)
    except ValueError:
        return False
    return True
