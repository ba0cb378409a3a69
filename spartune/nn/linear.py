"""SparseLinear: an nn.Linear whose weight is a spartune format, with all that PyTorch expects of a
layer: state_dict, autograd, torch.compile, CUDA graphs, `.to()`."""
from __future__ import annotations

import os
import sys
import warnings

import torch
from torch import nn

from .. import library, ops
from ..dispatch import cast_bias, cast_copy
from ..formats import NM, VNM, PackedNM, PackedVNM, SparseFormat, format_class
from ..formats.nm import _TileOrder
from ..prune import sparsify_weight

_SPEC_KEY = "_extra_state"  # nn.Module's name for get_extra_state()


PACKED_PADDING_MAX = 1.25  # stored values of a packed weight per kept value, past which it stays canonical


def packed_layout(fmt: SparseFormat, max_padding: float | None = None) -> SparseFormat | None:
    """A 2:4 NM or a V:N:M weight in the sparse tensor cores' tile order (PackedNM, PackedVNM),
    whose values the kernels read in place: the canonical format held them twice, its rows and
    the kernels' packing. None for other formats, and where the tiles would store more than
    `max_padding` values per canonical one."""
    cls = PackedNM if type(fmt) is NM and fmt.signature == "2:4" else PackedVNM if type(fmt) is VNM else None
    if cls is None or max_padding is not None and cls.stored_numel(fmt) > max_padding * max(fmt.values.numel(), 1):
        return None
    return cls.pack(fmt)


def kernel_layout(fmt: SparseFormat) -> SparseFormat:
    """The format a pruned layer keeps: `packed_layout`'s where there is one, unless its tiles pad
    the values by more than a quarter (rows to 16, the 2:4 matrix's K to 128 columns: a 1x1
    convolution of 32 channels stores 4x), then the format as it is."""
    return packed_layout(fmt, PACKED_PADDING_MAX) or fmt


class SparseLinear(nn.Module):
    """y = x @ W^T + b with W held in a sparse format; every call goes through the tuned
    dispatch, so it runs the fastest kernel for its shape (dense cuBLAS included).

    The format's tensors are the module's state: its values a Parameter (`weight_values`, which
    autograd and optimizers update; the pattern stays fixed), its index tensors buffers
    (`weight_<name>`), and its kind and static fields (the spec) the module's extra state, a
    uint8 tensor of JSON so that a state_dict is tensors only (safetensors takes it as is).
    `.to()`, `.half()`, `.cuda()` move and cast it like any parameter (index tensors keep their
    integer types). `weight` is the format object.
    """

    def __init__(self, weight: SparseFormat, bias: torch.Tensor | None = None, *, requires_grad: bool = False):
        """A layer around a sparse weight (spartune.sparsify_weight's format) and an optional (M,)
        bias. `requires_grad`: whether the weight's values (and the bias) train; False by default,
        unlike nn.Linear, since a layer built this way usually serves inference (from_linear
        follows the dense layer's own setting)."""
        super().__init__()
        if not isinstance(weight, SparseFormat):
            raise TypeError(f"weight must be a spartune format, got {type(weight).__name__}")
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
        self._adopt(weight, requires_grad)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=requires_grad)

    def _adopt(self, fmt: SparseFormat, requires_grad: bool) -> None:
        """Register fmt's tensors as this module's state and `fmt` (over them) as its weight."""
        names = fmt.tensor_fields()
        keep = fmt.values is self._parameters.get("weight_values")  # loaded into in place: optimizers keep it
        for name in getattr(self, "_weight_names", ()):
            if not (keep and name == "values"):
                delattr(self, f"weight_{name}")
        if not keep:
            self.weight_values = nn.Parameter(fmt.values.detach(), requires_grad=requires_grad)
        for name in names[1:]:
            self.register_buffer(f"weight_{name}", getattr(fmt, name))
        self._weight_names = names
        self._rebind(fmt.spec)

    def _rebind(self, spec: str) -> None:
        """The format object over the module's current tensors (trusted: they are the checked
        format's, moved or cast), found by the operators for its tuned choices and memos."""
        tensors = self._weight_tensors()
        # a cast keeps the Parameter object (param.data = ...) and the integer buffers: compare memory too
        where = [(t.data_ptr(), t.dtype, t.device) for t in tensors]
        old = self.__dict__.get("_weight")
        if old is None or self.__dict__.get("_weight_where") != where or any(
                a is not b for a, b in zip(old.tensor_list(), tensors)):
            self._weight = library.bind(SparseFormat.from_spec(spec, tensors, trusted=True))
            self._weight_where = where

    def __setstate__(self, state):
        """A deep copy or an unpickled module: its format came along over the new tensors but is
        not yet the one the operators find at their addresses (they would wrap and tune a new
        one on every call once more than a few such layers exist)."""
        super().__setstate__(state)
        if "_weight" in self.__dict__:
            for name in self._weight_names[1:]:  # a buffer its format repacked when unpickled (an older layout)
                held = getattr(self._weight, name)
                if held.shape != getattr(self, f"weight_{name}").shape:
                    self.register_buffer(f"weight_{name}", held)
            self._rebind(self._weight.spec)

    def _weight_tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f"weight_{name}") for name in self._weight_names]

    @property
    def weight(self) -> SparseFormat:
        return self._weight

    @property
    def in_features(self) -> int:
        return self._weight.shape[1]

    @property
    def out_features(self) -> int:
        return self._weight.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear, pattern, sparsity: float | None = None, *, return_report=False):
        """Prune `linear`'s weight by magnitude into `pattern` (see sparsify_weight); the
        layer trains if the linear's weight did."""
        fmt, report = sparsify_weight(linear.weight.detach(), pattern, sparsity, return_report=True)
        layer = cls(kernel_layout(fmt), None if linear.bias is None else linear.bias.detach(),
                    requires_grad=linear.weight.requires_grad)
        return (layer, report) if return_report else layer

    @classmethod
    def from_state_dict(cls, state_dict: dict, prefix: str = "") -> "SparseLinear":
        """A layer rebuilt from a state_dict alone (one saved from a SparseLinear)."""
        spec = _spec_of(state_dict, prefix)
        if spec is None:
            raise KeyError(f"no spartune weight in this state_dict under {prefix!r} (no {prefix}{_SPEC_KEY})")
        names = format_class(spec).tensor_fields()
        missing = [prefix + f"weight_{n}" for n in names if prefix + f"weight_{n}" not in state_dict]
        if missing:
            raise KeyError(f"state_dict lacks {missing}")
        fmt = SparseFormat.from_spec(spec, {n: state_dict[prefix + f"weight_{n}"].clone() for n in names})
        return cls(fmt, state_dict.get(prefix + "bias"))  # copies, as the bias is: nothing shared with the state_dict

    def tied_copy(self, bias: torch.Tensor | None) -> "SparseLinear":
        """A layer sharing this one's sparse weight (the same Parameter and buffers, as tied
        nn.Linear weights share theirs), with `bias` (a Parameter is shared, a tensor copied)."""
        new = SparseLinear.__new__(SparseLinear)
        nn.Module.__init__(new)
        new._tie_to(self)
        if bias is not None and not isinstance(bias, nn.Parameter):
            bias = nn.Parameter(bias.detach().clone(), requires_grad=self.weight_values.requires_grad)
        new.bias = bias
        return new

    def _tie_to(self, other: "SparseLinear") -> None:
        """Hold `other`'s sparse weight (its Parameter, buffers and format object) instead of one's own."""
        for name in getattr(self, "_weight_names", ()):
            delattr(self, f"weight_{name}")
        self.weight_values = other.weight_values
        for name in other._weight_names[1:]:
            self.register_buffer(f"weight_{name}", getattr(other, f"weight_{name}"))
        self._weight_names, self._weight, self._weight_where = other._weight_names, other._weight, other._weight_where

    # --- forward ---------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, *, activation: str | None = None) -> torch.Tensor:
        """x @ W^T + b, with `activation` applied in the kernels' epilogue (the pointwise convolutions').
        Under torch.autocast, in the autocast dtype as nn.Linear (`_forward_autocast`)."""
        if ops.any_autocast():
            cast = ops.autocast_dtype(x)
            if cast is not None and (x.dtype != cast or self._weight.dtype != cast):
                return self._forward_autocast(x, activation, cast)
        return self._forward(x, activation)

    def _forward(self, x: torch.Tensor, activation) -> torch.Tensor:
        """forward outside autocast (called by _forward_autocast too: a subclass's forward runs once)."""
        bias = self.bias
        if torch.compiler.is_compiling() or self._autograd_records(x, bias):
            # the operator, over the module's own tensors (what torch.compile lifts as inputs)
            return library.linear_op(x, self._weight_tensors(), self._weight.spec, bias, activation)
        return ops.linear(x, self._weight, bias, activation)

    def _autograd_records(self, x: torch.Tensor, bias) -> bool:
        """library.autograd_records for this layer's own tensors, written out: 0.4 us less a call
        (every forward asks it)."""
        return torch.is_grad_enabled() and (
            x.requires_grad or self.weight_values.requires_grad or (bias is not None and bias.requires_grad))

    def _forward_autocast(self, x: torch.Tensor, activation, cast: torch.dtype) -> torch.Tensor:
        """nn.Linear's behaviour under torch.autocast: the result in the autocast dtype. Inference,
        eager or compiled, runs on a copy of the weight in that dtype (dispatch.cast_copy: kept on
        the format, made again once its values change). Where autograd records, or under the
        lean memory policy (no copy), the layer runs in its weight's dtype (x cast to it, the
        gradient reaching the weight's own values) and the result is cast."""
        with torch.autocast(x.device.type, enabled=False):
            weight = self._weight
            if weight.dtype == cast:
                return self._forward(x.to(cast), activation)
            if self._autograd_records(x, self.bias) or ops.memory_policy() == "lean":
                return self._forward(x.to(weight.dtype), activation).to(cast)
            if torch.compiler.is_compiling():  # (the operator casts the bias: fusion can merge siblings)
                return library.linear_cast(x.to(cast), self._weight_tensors(), weight.spec, self.bias, activation,
                                           None, 1.0, None, cast)
            return ops.linear(x.to(cast), cast_copy(weight, cast), cast_bias(weight, self.bias, cast), activation)

    # --- state ---------------------------------------------------------------------------------------
    def get_extra_state(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(self._weight.spec.encode()), dtype=torch.uint8)

    def set_extra_state(self, state) -> None:  # _load_from_state_dict below reads the spec itself
        pass

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Rebuild the format from the saved tensors (validated), kept on this layer's device and
        dtype, never copied into the old pattern: another pattern, shape or format is either
        adopted whole or refused with a message."""
        mine = [k for k in state_dict if k.startswith(prefix) and "." not in k[len(prefix):]]
        spec = _spec_of(state_dict, prefix)
        if spec is None:  # none of this layer's state is there: every key it holds is missing
            own = [f"weight_{n}" for n in self._weight.tensor_fields()] + (["bias"] if self.bias is not None else [])
            missing_keys.extend(prefix + k for k in own + [_SPEC_KEY] if prefix + k not in state_dict)
            if any(k == prefix + "weight" for k in mine):
                error_msgs.append(f"{prefix}weight is a dense tensor: this state_dict holds an nn.Linear, not a "
                                  "spartune SparseLinear (prune it with SparseLinear.from_linear instead)")
            return
        try:
            names = format_class(spec).tensor_fields()
        except ValueError as e:
            error_msgs.append(f"{prefix}{_SPEC_KEY}: {e}")
            return
        wanted = {f"weight_{n}" for n in names} | {_SPEC_KEY} | ({"bias"} if self.bias is not None else set())
        unexpected_keys.extend(k for k in mine if k[len(prefix):] not in wanted)
        absent = [prefix + k for k in sorted(wanted) if prefix + k not in state_dict]
        if absent:
            missing_keys.extend(absent)
            return
        current = self._weight
        try:
            # copies: the layer must not share memory with the state_dict (another model's tensors)
            fmt = SparseFormat.from_spec(spec, {n: state_dict[prefix + f"weight_{n}"].to(current.device, copy=True)
                                                for n in names})
        except (TypeError, ValueError) as e:
            error_msgs.append(f"{prefix}: the saved sparse weight is not valid: {e}")
            return
        if fmt.shape != current.shape:
            error_msgs.append(f"size mismatch for {prefix}weight: the saved weight is {fmt.shape[0]}x{fmt.shape[1]}, "
                              f"this layer's is {current.shape[0]}x{current.shape[1]}")
            return
        if self.bias is not None:
            saved_bias = state_dict[prefix + "bias"]
            if saved_bias.shape != self.bias.shape:
                error_msgs.append(f"size mismatch for {prefix}bias: copying a param with shape {tuple(saved_bias.shape)}, "
                                  f"the shape in current model is {tuple(self.bias.shape)}")
                return
            with torch.no_grad():
                self.bias.copy_(saved_bias)
        fmt = fmt.with_values(fmt.values.to(current.dtype)) if fmt.dtype != current.dtype else fmt
        fmt = _in_layout_of(current, fmt)
        if fmt.values.shape == self.weight_values.shape:  # into the same Parameter, as nn.Linear loads
            with torch.no_grad():
                self.weight_values.copy_(fmt.values)
            fmt = fmt._with_values_trusted(self.weight_values)
        else:  # nn.Linear would refuse; a sparse checkpoint may keep other positions: said, not silent
            _warn_caller(f"{prefix}weight: the checkpoint keeps {fmt.values.numel()} values where this layer "
                         f"kept {self.weight_values.numel()} ({fmt.spec}): weight_values is a new Parameter, "
                         "so an optimizer built before this load, and layers tied to this one, still hold "
                         "the old one (build optimizers after loading)")
        self._adopt(fmt, self.weight_values.requires_grad)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._rebind(self._weight.spec)  # a moved or cast format is a new object (tuned again, for its dtype)
        return self

    def extra_repr(self) -> str:
        return f"{self._weight!r}, bias={self.bias is not None}"


def _in_layout_of(current: SparseFormat, fmt: SparseFormat) -> SparseFormat:
    """A saved weight in the layer's layout where only the layout differs (a canonical checkpoint
    into a packed layer, or back): the same weight, loaded into the layer's own Parameter (an
    optimizer built before and tied layers keep it), not adopted as another format."""
    if isinstance(current, _TileOrder) and type(fmt) is current._canonical:
        packed = packed_layout(fmt)
        return packed if type(packed) is type(current) else fmt
    if isinstance(fmt, _TileOrder) and type(current) is fmt._canonical:
        return fmt.unpack()
    return fmt


def _warn_caller(message: str) -> None:
    """A UserWarning attributed to the first caller outside spartune and torch (the user's
    load_state_dict), not to torch's loading machinery a few frames below it."""
    roots = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(roots):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level + 1)


def _spec_of(state_dict, prefix: str) -> str | None:
    raw = state_dict.get(prefix + _SPEC_KEY)
    if raw is None:
        return None
    if isinstance(raw, torch.Tensor):
        return bytes(raw.to("cpu", torch.uint8).tolist()).decode(errors="replace")  # bad bytes: format_class says so
    return str(raw)
