"""load_sparse_state_dict(model, state_dict): a sparsified model's checkpoint into a freshly built
dense model. Without it the dense layers refuse the checkpoint (they expect a dense `weight`), and
pruning a random model first only to overwrite it draws and discards a whole model's weights."""
from __future__ import annotations

import torch
from torch import nn

from ..formats import format_class
from .attention import PROJECTIONS, SparseMultiheadAttention, disable_fused_fast_paths
from .conv import _SparsePointwise, is_pointwise, sparse_pointwise_class
from .linear import _SPEC_KEY, SparseLinear, _spec_of
from .sparsify import _get, _set, is_transposed_linear


_IN_PROJECTIONS = tuple(p for p in PROJECTIONS if p != "out_proj")  # nn.MultiheadAttention has out_proj too


def load_sparse_state_dict(model: nn.Module, state_dict: dict, *, strict: bool = True):
    """Load `state_dict`, saved from a sparsified model (`model.state_dict()` after sparsify), into
    `model`, a dense model of the same architecture: each layer the checkpoint holds sparse becomes
    sparse first as sparsify made it (SparseLinear for nn.Linear and transformers' Conv1D,
    SparseConv1d / SparseConv2d for pointwise convolutions, SparseMultiheadAttention for attention,
    tied weights shared again), then `model.load_state_dict(state_dict, strict)` loads every
    tensor; its result is returned. Nothing is pruned and no random weight is drawn. A sparse layer
    where the model has no linear layer or pointwise convolution raises before anything changes.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"load_sparse_state_dict: model must be an nn.Module, got {type(model).__name__}")
    prefixes = sorted(k[: len(k) - len(_SPEC_KEY)] for k in state_dict
                      if k.endswith(_SPEC_KEY) and _is_spartune_spec(_spec_of(state_dict, k[: len(k) - len(_SPEC_KEY)])))
    attention = {name for name, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)
                 and any(k.startswith(_join(name, p) + ".") for k in state_dict for p in _IN_PROJECTIONS)}
    built = {}  # name -> the sparse layer; every one built (or refused) before the model changes
    made = {}  # the values' storage -> the layer built on them (ties)
    for prefix in prefixes:
        name, old = _target(model, prefix[:-1], attention)
        if isinstance(old, (SparseLinear, _SparsePointwise)):
            continue  # already sparse: load_state_dict loads it
        absent = [prefix + f"weight_{n}" for n in format_class(_spec_of(state_dict, prefix)).tensor_fields()
                  if prefix + f"weight_{n}" not in state_dict]
        if absent:
            if strict:
                raise KeyError(f"load_sparse_state_dict: the checkpoint's sparse layer {prefix[:-1]!r} lacks {absent}")
            continue  # left as it is: load_state_dict reports what does not fit
        values, bias = state_dict[prefix + "weight_values"], state_dict.get(prefix + "bias")
        tie = made.get(_storage(values))
        if tie is not None:
            layer = tie.tied_copy(tie.bias if bias is not None and tie.bias is not None
                                  and _storage(bias) == _storage(tie.bias) else bias)
        else:
            layer = made[_storage(values)] = SparseLinear.from_state_dict(state_dict, prefix)
            trains, device = old.weight.requires_grad, old.weight.device
            layer.weight_values.requires_grad_(trains)
            if layer.bias is not None:
                layer.bias.requires_grad_(trains)
            if device.type != "meta":  # where the model is (before any tie shares it)
                layer.to(device)
        if isinstance(old, (nn.Conv1d, nn.Conv2d)):
            layer = sparse_pointwise_class(old)(layer.weight, layer.bias, requires_grad=old.weight.requires_grad)
        built[name] = layer
    for name in attention:
        _set(model, name, SparseMultiheadAttention.from_mha(_get(model, name)))
    for name, layer in built.items():
        _set(model, name, layer)
    disable_fused_fast_paths(model)
    return model.load_state_dict(state_dict, strict=strict)


def _target(model, name, attention):
    """(the module name to replace, the module there now) for a sparse layer saved under `name`."""
    parent, _, child = name.rpartition(".")
    if child == "linear":  # a pointwise convolution's SparseLinear
        try:
            conv = _get(model, parent)
        except AttributeError:
            conv = None
        if isinstance(conv, _SparsePointwise) or isinstance(conv, (nn.Conv1d, nn.Conv2d)) and is_pointwise(conv):
            return parent, conv
    if parent in attention and child in PROJECTIONS:
        mha = _get(model, parent)
        return name, mha.out_proj if child == "out_proj" else _LinearShape(mha, child)
    try:
        old = _get(model, name)
    except AttributeError:
        raise ValueError(f"load_sparse_state_dict: the checkpoint holds a sparse layer {name!r} that the model "
                         "does not have") from None
    if isinstance(old, (nn.Linear, SparseLinear)) or is_transposed_linear(old):
        return name, old
    raise ValueError(f"load_sparse_state_dict: the checkpoint holds a sparse layer {name!r}, where the model has "
                     f"{type(old).__name__} (a linear layer or a pointwise convolution was expected)")


class _LinearShape:
    """What _target reports for an MHA in-projection, which is no module before the conversion:
    its weight's device and requires_grad."""

    def __init__(self, mha: nn.MultiheadAttention, child: str):
        self.weight = mha.in_proj_weight if child == "in_proj" else getattr(mha, f"{child}_weight")


def _storage(t: torch.Tensor):
    return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)


def _is_spartune_spec(spec) -> bool:
    if spec is None:
        return False
    try:
        format_class(spec)
    except ValueError:
        return False
    return True


def _join(name: str, child: str) -> str:
    return f"{name}.{child}" if name else child
