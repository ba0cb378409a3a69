"""What every sparse format shares: immutability, validation helpers, stats for the cost model.

A format is a frozen dataclass of tensors. Construction always runs `_validate`, so an
object that exists is a valid one; `from_dense` is the friendly way in.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
BLOCK_SIZES = (16, 32, 64, 128)


@dataclass(frozen=True)
class FormatStats:
    """What the cost model needs to know about a sparse matrix, independent of its format.

    A format is a list of *units* (a row for CSR/N:M, a block-row for BSR, a group of V
    rows for Shfl-BW/V:N:M), each holding some *items* (nonzeros, blocks, kept columns).
    Work per program follows items per unit; load balance follows their spread.
    """

    rows: int
    cols: int
    nnz: int
    density: float
    unit_rows: int  # rows per unit
    units: int
    items_mean: float  # items per unit
    items_cv: float  # coefficient of variation of items per unit
    items_max: int
    empty_units: int
    item_cols: int  # columns one item spans (1 for a nonzero, bk for a block)


def stats_from_counts(rows, cols, nnz, unit_rows, item_cols, counts: torch.Tensor) -> FormatStats:
    counts = counts.to(torch.float64).cpu()
    units = counts.numel()
    mean = counts.mean().item() if units else 0.0
    std = counts.std(unbiased=False).item() if units else 0.0
    return FormatStats(
        rows=rows,
        cols=cols,
        nnz=nnz,
        density=nnz / max(1, rows * cols),
        unit_rows=unit_rows,
        units=units,
        items_mean=mean,
        items_cv=std / mean if mean > 0 else 0.0,
        items_max=int(counts.max().item()) if units else 0,
        empty_units=int((counts == 0).sum().item()),
        item_cols=item_cols,
    )


def index_dtype(extent: int) -> torch.dtype:
    """Narrowest signed type that holds indices in [0, extent): int16 halves index traffic."""
    return torch.int16 if extent < 2**15 else torch.int32


def pointers_from_counts(counts: torch.Tensor) -> torch.Tensor:
    """Row pointers (length units + 1, int32) from items per unit."""
    ptr = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(counts, 0, out=ptr[1:])
    if ptr[-1].item() >= 2**31:
        raise ValueError(f"too many stored entries for int32 pointers: {ptr[-1].item()}")
    return ptr.to(torch.int32)


def unit_of_items(ptr: torch.Tensor, items: int | None = None) -> torch.Tensor:
    """For pointers (units + 1,), the unit of every item: the row of each nonzero, the
    block-row of each block, the group of each kept column. `items` (ptr[-1], when the caller
    knows it) spares a host sync, so a CUDA graph can capture the call (a decompression)."""
    return torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=ptr.device), (ptr[1:] - ptr[:-1]).long(),
                                   output_size=items)


def check_sorted_within_units(name: str, unit: torch.Tensor, idx: torch.Tensor, what: str) -> None:
    """Indices strictly increasing inside every unit (canonical order, no duplicates)."""
    c = idx.long()
    bad = (unit[1:] == unit[:-1]) & (c[1:] <= c[:-1])
    if bool(bad.any()):
        raise ValueError(f"{name} must be strictly increasing within each {what}; {what} {int(unit[1:][bad][0])} is not")


def check_dense_weight(w, name: str = "w") -> None:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, cols), got shape {tuple(w.shape)}")
    if w.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor ({', '.join(map(str, FLOAT_DTYPES))}), got {w.dtype}")
    if w.is_sparse or w.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {w.layout}")


def check_block_size(name: str, size, allowed=BLOCK_SIZES) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {size!r}")
    return size


def check_tensor(name, t, *, dtypes, dim, device=None, shape=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the values are on {device}: all tensors must share a device")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_range(name: str, t: torch.Tensor, lo: int, hi: int) -> None:
    """All entries in [lo, hi)."""
    if t.numel() == 0:
        return
    mn, mx = t.min().item(), t.max().item()
    if mn < lo or mx >= hi:
        raise ValueError(f"{name} must lie in [{lo}, {hi}), found values in [{mn}, {mx}]")


def check_pointers(name: str, ptr: torch.Tensor, units: int, total: int) -> None:
    check_tensor(name, ptr, dtypes=(torch.int32,), dim=1, shape=(units + 1,))
    if ptr[0].item() != 0 or ptr[-1].item() != total:
        raise ValueError(f"{name} must start at 0 and end at {total}, got {ptr[0].item()} .. {ptr[-1].item()}")
    if units and bool((ptr[1:] < ptr[:-1]).any()):
        bad = int(torch.nonzero(ptr[1:] < ptr[:-1])[0].item())
        raise ValueError(f"{name} must be non-decreasing; it decreases after unit {bad}")


def check_shape(shape) -> tuple[int, int]:
    if (
        not isinstance(shape, tuple)
        or len(shape) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
    ):
        raise ValueError(f"shape must be a tuple of two non-negative ints, got {shape!r}")
    return shape


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# Attributes memoised on a format object that depend on its pattern only, never on its values
# (stats(); kernels register theirs, e.g. the CSR bitmap): kept by _with_values_trusted.
PATTERN_CACHES = {"_stats", "_spec"}
_STATE_CACHES = frozenset(PATTERN_CACHES)  # what a pickle or deep copy of a format carries beside its fields


def values_version(values: torch.Tensor) -> tuple:
    """What says a format's values changed since a copy was made of them: torch's version counter
    (in-place updates, an optimizer step) and their address (`param.data = t`, as
    torch.nn.utils.vector_to_parameters does). Edits through `param.data.mul_(...)` change
    neither: torch does not count them, so they stay unseen (README, "Inside a PyTorch model").
    Inference tensors (a model built under torch.inference_mode) have no version counter: their
    address alone (their in-place edits, which only inference mode allows, are unseen too)."""
    try:
        return values._version, values.data_ptr()
    except RuntimeError:
        return None, values.data_ptr()


class _Anchor:
    """A storage held alive, and dropped by pickle and deepcopy (a copy of the format has its
    own values: nothing of the original's to hold)."""

    __slots__ = ("storage",)

    def __init__(self, storage=None):  # (None: unpickled)
        self.storage = storage

    def __reduce__(self):
        return _Anchor, ()


def values_anchor(values: torch.Tensor) -> _Anchor:
    """Kept beside a copy keyed by values_version: the values' storage, held so that no later
    tensor takes their address while the copy stands (`p.data = t1`, a call, then `p.data = t2;
    p.data = t3` could give t3 t1's address and version 0: the old key would match)."""
    return _Anchor(values.untyped_storage())


def memo(A, key: str, make, *, of_values: bool = True, keep: bool = True, source: torch.Tensor | None = None):
    """`make()` memoised on the format object `A` under `key`. A memo built from the values
    (`of_values`, the default: a dense copy, a packed layout) is made again once they change in
    place (an optimizer step, `A.values.mul_`); one of the pattern alone is kept, and carried
    to the same pattern with new values (PATTERN_CACHES). `keep=False`: the memo if there is a
    current one, else `make()` unstored (a step towards another layout need not stay in memory).
    `source`: the tensor the memo is made from when it is not A's values (a layer's bias)."""
    watched = A.values if source is None else source
    version = values_version(watched) if of_values else None
    entry = A.__dict__.get(key)
    if entry is None or entry[0] != version:
        if not keep:
            with torch.no_grad():
                return make()
        if not of_values:
            PATTERN_CACHES.add(key)
        with torch.no_grad():  # a memo is a copy for the kernels, never part of an autograd graph
            entry = (version, make(), values_anchor(watched) if of_values else None)
        object.__setattr__(A, key, entry)
    return entry[1]


STATIC_FIELDS = {"shape", "block", "v", "n", "m"}  # the non-tensor fields a format may have
FORMATS: dict[str, type] = {}  # class name -> format class, filled as subclasses are defined


def format_class(spec: str) -> type:
    """The format class a spec names."""
    try:
        name = json.loads(spec)["format"]
    except (ValueError, TypeError, KeyError):
        raise ValueError(f"not a spartune format spec: {spec!r}") from None
    if name not in FORMATS:
        raise ValueError(f"unknown sparse format {name!r} in spec; known: {sorted(FORMATS)}")
    return FORMATS[name]


class SparseFormat:
    """Mixin for the frozen dataclasses in this package.

    Subclasses define `values` (the stored values, any shape), `_validate()`,
    `_scatter(values) -> dense (rows, cols)` and `stats()`.
    """

    shape: tuple[int, int]
    values: torch.Tensor

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        FORMATS[cls.__name__] = cls
        # its dataclass fields, in order, are its own annotations: the tensors, values first
        names = [n for n in cls.__dict__.get("__annotations__", {}) if n not in STATIC_FIELDS]
        cls._tensor_fields = ("values", *(n for n in names if n != "values"))

    def __post_init__(self):
        self._canonicalize()
        check_shape(self.shape)
        if not isinstance(self.values, torch.Tensor) or self.values.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"values must be a floating torch.Tensor, got "
                f"{getattr(self.values, 'dtype', type(self.values).__name__)}"
            )
        if not self.values.is_contiguous():
            raise ValueError("values must be contiguous")
        self._validate()
        self.spec  # noqa: B018 (made now, not inside a torch.compile trace, where json cannot run)

    def _canonicalize(self) -> None:
        """Bring tensors given in an older layout to the current one, before any check (a format
        constructed, rebuilt from its spec, or unpickled). Most formats have had one layout."""

    def __getstate__(self):
        """The format's own fields (and its spec and stats): the copies memoised on it for the
        kernels (a dense copy, packed layouts, launch caches) stay behind, made again where the
        copy runs. torch.save(model) and copy.deepcopy then hold the weight once."""
        keep = _STATE_CACHES | {f.name for f in dataclasses.fields(self)}
        return {k: v for k, v in self.__dict__.items() if k in keep}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._canonicalize()

    # --- what every format answers -------------------------------------------------------
    signature: str  # the pattern string it holds ("csr", "block:64x64", ...): part of tuning keys

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def nnz(self) -> int:
        """Stored entries inside the matrix (explicit zeros of the pattern included)."""
        return self.stats().nnz

    @property
    def density(self) -> float:
        return self.stats().density

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def to(self, *args, copy: bool = False, **kwargs) -> "SparseFormat":
        """Tensor.to's forms: a device moves every tensor, a floating dtype casts the values (the
        indices keep theirs): A.to("cuda"), A.to(torch.float16), A.to("cuda", torch.bfloat16);
        copy=True gives new tensors even where nothing changes, as Tensor.to(copy=True) does."""
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(f"a sparse weight's values take a floating dtype, got {dtype}")
        tensors = self._tensors()
        moved = {k: t.to(device or t.device, copy=copy) for k, t in tensors.items()}
        out = self if all(moved[k] is t for k, t in tensors.items()) else dataclasses.replace(self, **moved)
        return out if dtype is None or dtype == out.values.dtype else out.with_values(out.values.to(dtype))

    def to_dense(self) -> torch.Tensor:
        return self._scatter(self.values)

    def mask(self) -> torch.Tensor:
        """Boolean (rows, cols): where the pattern stores an entry (explicit zeros included)."""
        return self._scatter(torch.ones_like(self.values)).to(torch.bool)

    def stored_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(order, flat), int64 (nnz,) each: the stored entries inside the matrix (explicit
        zeros included, padding slots not), in row-major order of (row, col), as their slots in
        `values.reshape(-1)` and their flat positions in the dense (rows, cols) matrix. A
        pattern memo: gathers (sddmm / softmax fallbacks, weight gradients) reuse it every call."""

        def make():
            mask = self.mask()
            slots = torch.arange(self.values.numel(), device=self.device, dtype=torch.float64)
            return self._scatter(slots.reshape(self.values.shape))[mask].long(), mask.reshape(-1).nonzero().squeeze(1)

        return memo(self, "_stored_positions", make, of_values=False)

    def gather(self, dense: torch.Tensor) -> torch.Tensor:
        """Values for this pattern read off a dense (rows, cols) tensor (in its dtype): the entry
        at every stored position, zero in padding slots. The adjoint of `_scatter`, so the weight
        gradient of y = x @ A^T is `A.gather(dy^T @ x)`; also sddmm's dense fallback."""
        if tuple(dense.shape) != self.shape:
            raise ValueError(f"dense must have shape {self.shape}, got {tuple(dense.shape)}")
        order, flat = self.stored_positions()
        out = dense.new_zeros(self.values.numel())
        out[order] = dense.reshape(-1)[flat]
        return out.reshape(self.values.shape)

    def with_values(self, values: torch.Tensor) -> "SparseFormat":
        """Same pattern, new values (the result of an SDDMM, a cast, ...)."""
        if tuple(values.shape) != tuple(self.values.shape):
            raise ValueError(f"values must have shape {tuple(self.values.shape)}, got {tuple(values.shape)}")
        return dataclasses.replace(self, values=values.contiguous())

    def _with_values_trusted(self, values: torch.Tensor) -> "SparseFormat":
        """with_values for values an op just computed on this very pattern (same shape and
        device, a float dtype): the unchanged pattern is not validated again (O(nnz) work and host syncs
        on every sddmm / sparse_softmax call), and its memoised PATTERN_CACHES carry over."""
        if tuple(values.shape) != tuple(self.values.shape):
            raise ValueError(f"values must have shape {tuple(self.values.shape)}, got {tuple(values.shape)}")
        new = object.__new__(type(self))
        for f in dataclasses.fields(self):
            object.__setattr__(new, f.name, getattr(self, f.name))
        object.__setattr__(new, "values", values.contiguous())
        for key in PATTERN_CACHES.intersection(self.__dict__):
            object.__setattr__(new, key, self.__dict__[key])
        return new

    # --- a format as plain tensors and a string (torch.library operators, state_dict) ----------
    @property
    def spec(self) -> str:
        """The format's class and static fields (shape, block, ...) as JSON: with `tensor_list()`
        all it takes to rebuild it (`from_spec`)."""
        cached = self.__dict__.get("_spec")
        if cached is None:
            static = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                      if not isinstance(getattr(self, f.name), torch.Tensor)}
            cached = json.dumps({"format": type(self).__name__, **static}, separators=(",", ":"))
            object.__setattr__(self, "_spec", cached)
        return cached

    @classmethod
    def tensor_fields(cls) -> tuple[str, ...]:
        """Names of the tensor fields, `values` first (the order of `tensor_list`)."""
        return cls._tensor_fields

    def tensor_list(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self.tensor_fields()]

    @staticmethod
    def from_spec(spec: str, tensors, *, trusted: bool = False) -> "SparseFormat":
        """The format `spec` describes over `tensors` (in `tensor_fields` order, or a dict by
        name). Validated unless `trusted` (tensors taken from a format that was)."""
        cls = format_class(spec)
        fields = json.loads(spec)
        del fields["format"]
        names = cls.tensor_fields()
        if not isinstance(tensors, dict):
            tensors = list(tensors)
            if len(tensors) != len(names):
                raise ValueError(f"{cls.__name__} needs {len(names)} tensors {names}, got {len(tensors)}")
            tensors = dict(zip(names, tensors))
        static = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        if not trusted:
            return cls(**static, **tensors)
        new = object.__new__(cls)
        for name, value in {**static, **tensors}.items():
            object.__setattr__(new, name, value)
        new._canonicalize()
        new.spec  # noqa: B018 (made now, as __post_init__ does)
        return new

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, device={self.device}, "
            f"nnz={s.nnz}, density={s.density:.4f})"
        )

    # memoised per instance: frozen objects never change, and the cost model asks often
    def stats(self) -> FormatStats:
        cached = self.__dict__.get("_stats")
        if cached is None:
            cached = self._compute_stats()
            object.__setattr__(self, "_stats", cached)
        return cached


__all__ = [
    "FormatStats",
    "memo",
    "format_class",
    "SparseFormat",
    "ceil_div",
    "check_block_size",
    "check_dense_weight",
    "check_pointers",
    "check_range",
    "check_tensor",
    "index_dtype",
    "pointers_from_counts",
    "unit_of_items",
    "check_sorted_within_units",
    "stats_from_counts",
]
