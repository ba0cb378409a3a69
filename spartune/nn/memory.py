"""What a model's weights hold in memory, kernels' copies included."""
from __future__ import annotations

import itertools

import torch
from torch import nn

from ..formats import SparseFormat
from ..formats.stack import stacks_of
from .linear import SparseLinear, packed_layout


def resident_bytes(model: nn.Module) -> int:
    """Bytes the model's weights hold: its parameters and buffers, and what each sparse weight
    keeps beside them for the kernels the tuner chose (packed layouts, a library's copy, the
    static tensors of captured calls), each storage counted once. A state_dict counts only the
    first part; this is what the device must hold to run the model."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"resident_bytes takes an nn.Module, got {type(model).__name__}")
    sizes: dict = {}
    visited: set = set()

    def walk(obj) -> None:
        if torch.is_tensor(obj):
            if obj.layout != torch.strided:  # torch.sparse copies (cuSPARSE's CSR / BSR)
                parts = (obj.values(), obj.crow_indices(), obj.col_indices()) \
                    if obj.layout in (torch.sparse_csr, torch.sparse_bsr) else (obj._values(), obj._indices())
                for part in parts:
                    walk(part)
            elif obj.device.type != "meta":
                storage = obj.untyped_storage()
                sizes[(obj.device, storage.data_ptr())] = storage.nbytes()
            return
        if id(obj) in visited:
            return
        visited.add(id(obj))
        if isinstance(obj, (tuple, list, set, frozenset)):
            for item in obj:
                walk(item)
        elif isinstance(obj, dict):
            for item in obj.values():
                walk(item)
        elif type(obj).__module__.startswith("spartune") and hasattr(obj, "__dict__"):
            walk(vars(obj))  # a format's memos, a captured call (its static inputs and output)

    for t in itertools.chain(model.parameters(), model.buffers()):
        walk(t)
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, SparseFormat):
                walk(value)
                walk(stacks_of(value))  # torch.compile's fused layers: stacked copies, tuned too
    return sum(sizes.values())


def pack_weights(model: nn.Module) -> nn.Module:
    """Store each SparseLinear's 2:4 NM or V:N:M weight as a PackedNM or PackedVNM (in place;
    returns `model`), as `sparsify` and `from_linear` do (they leave a small layer canonical where
    the tiles would pad its values by more than a quarter; here every such layer is packed): for
    layers built from a canonical format (a checkpoint saved before, a format given by hand). The
    values are then stored in the order the sparse tensor cores read them, so the kernels read the
    weight itself and the layer holds its kept values once instead of twice (the canonical rows
    and the kernels' packing). Outputs, gradients and state_dict work as before (a state_dict then
    holds the packed layout; `SparseLinear.from_state_dict` and `load_state_dict` take it). Like
    `.to()`, each packed layer gets a new `weight_values` Parameter: make the optimizer afterwards;
    tied layers stay tied."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"pack_weights takes an nn.Module, got {type(model).__name__}")
    # a tied weight's Parameter id -> (the Parameter, held so its id stays unique; the layer that packed it)
    done: dict[int, tuple] = {}
    for module in model.modules():
        if not isinstance(module, SparseLinear):
            continue
        first = done.get(id(module.weight_values))
        if first is not None:  # tied to a layer packed already: tied to its packed weight
            module._tie_to(first[1])
            continue
        packed = packed_layout(module.weight)
        if packed is not None:
            done[id(module.weight_values)] = (module.weight_values, module)
            with torch.no_grad():
                module._adopt(packed, module.weight_values.requires_grad)
    return model
