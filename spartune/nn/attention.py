"""Attention whose projections are ordinary nn.Linear submodules, so sparsify() can convert them.

nn.MultiheadAttention cannot be sparsified: its in-projection is a raw (3E, E) Parameter and
F.multi_head_attention_forward reads `out_proj.weight` as a tensor instead of calling `out_proj`.
nn.TransformerEncoderLayer / nn.TransformerEncoder in eval mode also bypass their submodules through
a fused kernel that takes every weight as a tensor; disable_fused_fast_paths() turns that off.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


# the projections sparsify converts, as child module names (in_proj, or q/k/v_proj when kdim or
# vdim differ from embed_dim)
PROJECTIONS = ("in_proj", "q_proj", "k_proj", "v_proj", "out_proj")


class SparseMultiheadAttention(nn.Module):
    """nn.MultiheadAttention's computation (same forward signature and outputs) with the packed
    in-projection held by `in_proj` = nn.Linear(E, 3E) (or, when kdim or vdim differ from E, by
    `q_proj`, `k_proj`, `v_proj`) and the out-projection by `out_proj`, all *called* as modules,
    so a SparseLinear swapped in by sparsify() is the one that runs. add_bias_kv and
    add_zero_attn append their key/value rows as MHA does.

    Its state_dict keys are the modules' (`in_proj.weight`, ...), not MHA's `in_proj_weight`,
    `q_proj_weight`, ...; build one from a trained MHA with from_mha().
    """
    # The fused encoder-layer path calls self_attn.merge_masks(src_mask, src_key_padding_mask, src)
    # (self-attention only, it assumes L == S); torch's own function needs nothing but self.num_heads.
    merge_masks = nn.MultiheadAttention.merge_masks

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be a positive multiple of num_heads {num_heads}")
        self.embed_dim = embed_dim
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        if self.kdim <= 0 or self.vdim <= 0:
            raise ValueError(f"kdim and vdim must be positive, got {self.kdim} and {self.vdim}")
        self._qkv_same_embed_dim = self.kdim == self.vdim == embed_dim  # read by the encoders' fast-path checks
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.add_zero_attn = add_zero_attn
        factory = dict(device=device, dtype=dtype)
        if self._qkv_same_embed_dim:
            self.in_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias, **factory)
            inputs = [self.in_proj]
        else:
            self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
            self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias, **factory)
            self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias, **factory)
            inputs = [self.q_proj, self.k_proj, self.v_proj]
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim, **factory)) if add_bias_kv else None
        self.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim, **factory)) if add_bias_kv else None
        # nn.MultiheadAttention's initialisation (out_proj keeps nn.Linear's weight init)
        for linear in inputs:
            nn.init.xavier_uniform_(linear.weight)
            if bias:
                nn.init.zeros_(linear.bias)
        if bias:
            nn.init.zeros_(self.out_proj.bias)
        if add_bias_kv:
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)

    # The names nn.MultiheadAttention has; TransformerEncoder(Layer) read them in their fast-path checks.
    @property
    def in_proj_weight(self):
        return self.in_proj.weight if self._qkv_same_embed_dim else None

    @property
    def in_proj_bias(self):
        if self._qkv_same_embed_dim:
            return self.in_proj.bias
        parts = [m.bias for m in (self.q_proj, self.k_proj, self.v_proj)]
        return None if parts[0] is None else torch.cat(parts)

    @classmethod
    def from_mha(cls, mha: nn.MultiheadAttention) -> SparseMultiheadAttention:
        """A copy of `mha` (weights, device, dtype, dropout, batch_first, every option, training flag)."""
        w = mha.out_proj.weight
        new = cls(mha.embed_dim, mha.num_heads, mha.dropout, bias=mha.in_proj_bias is not None,
                  add_bias_kv=mha.bias_k is not None, add_zero_attn=mha.add_zero_attn, kdim=mha.kdim, vdim=mha.vdim,
                  batch_first=mha.batch_first, device="meta", dtype=w.dtype).to_empty(device=w.device)
        # built on "meta" (no init, no draw from the RNG): every tensor is copied below
        if mha._qkv_same_embed_dim:
            pairs = [(new.in_proj.weight, mha.in_proj_weight), (new.in_proj.bias, mha.in_proj_bias)]
        else:
            biases = (None,) * 3 if mha.in_proj_bias is None else mha.in_proj_bias.chunk(3)
            pairs = [(new.q_proj.weight, mha.q_proj_weight), (new.k_proj.weight, mha.k_proj_weight),
                     (new.v_proj.weight, mha.v_proj_weight), (new.q_proj.bias, biases[0]),
                     (new.k_proj.bias, biases[1]), (new.v_proj.bias, biases[2])]
        pairs += [(new.out_proj.weight, w), (new.out_proj.bias, mha.out_proj.bias), (new.bias_k, mha.bias_k),
                  (new.bias_v, mha.bias_v)]
        with torch.no_grad():
            for dst, src in pairs:
                if dst is not None:
                    dst.copy_(src)
        return new.train(mha.training)

    def _project(self, query, key, value):
        """q, k, v through `in_proj`. One call for self-attention. Otherwise each distinct input
        goes through the whole (3E, E) projection and keeps its third: a sparse weight cannot be
        sliced into its q/k/v rows, so cross-attention pays up to 3x the in-projection work.
        With kdim or vdim apart from E, each through its own projection."""
        if not self._qkv_same_embed_dim:
            return self.q_proj(query), self.k_proj(key), self.v_proj(value)
        E = self.embed_dim
        pq = self.in_proj(query)
        pk = pq if key is query else self.in_proj(key)
        pv = pk if value is key else pq if value is query else self.in_proj(value)
        return pq[..., :E], pk[..., E:2 * E], pv[..., 2 * E:]

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """As nn.MultiheadAttention.forward: returns (output, weights or None)."""
        batched = F._mha_shape_check(query, key, value, key_padding_mask, attn_mask, self.num_heads)
        # masks as MHA canonicalises them: bool -> float with -inf where True
        key_padding_mask = F._canonical_mask(
            mask=key_padding_mask, mask_name="key_padding_mask",
            other_type=F._none_or_dtype(attn_mask), other_name="attn_mask", target_type=query.dtype)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as nn.MultiheadAttention)")
        # as F.multi_head_attention_forward: the hint replaces the mask only when SDPA gets it alone
        is_causal = is_causal and key_padding_mask is None and not need_weights
        attn_mask = None if is_causal else F._canonical_mask(
            mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
            target_type=query.dtype, check_other=False)

        q, k, v = self._project(query, key, value)
        if not batched:
            q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        # key/value rows MHA appends (add_bias_kv's, then add_zero_attn's): attended to, never masked
        extra_k, extra_v = [], []
        if self.bias_k is not None:
            extra_k.append(self.bias_k.expand(k.shape[0], 1, -1))
            extra_v.append(self.bias_v.expand(v.shape[0], 1, -1))
        if self.add_zero_attn:
            extra_k.append(k.new_zeros(k.shape[0], 1, k.shape[2]))
            extra_v.append(v.new_zeros(v.shape[0], 1, v.shape[2]))
        if extra_k:
            k, v = torch.cat([k, *extra_k], dim=1), torch.cat([v, *extra_v], dim=1)
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, len(extra_k)))
            key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, len(extra_k)))
        N, L, S = q.shape[0], q.shape[1], k.shape[1]
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2) for t in (q, k, v))

        # one additive mask broadcastable to (N, H, L, S); MHA.merge_masks would do this but assumes L == S
        if attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask.view(N, self.num_heads, L, S)
        if key_padding_mask is not None:
            kpm = key_padding_mask.view(N, 1, 1, S)
            attn_mask = kpm if attn_mask is None else attn_mask + kpm
        dropout_p = self.dropout if self.training else 0.0

        if need_weights:
            scores = (q * self.head_dim ** -0.5) @ k.transpose(-2, -1)
            weights = torch.softmax(scores if attn_mask is None else scores + attn_mask, dim=-1)
            if dropout_p > 0.0:
                weights = F.dropout(weights, p=dropout_p)  # MHA returns the weights after dropout too
            out = weights @ v
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if not batched:
                weights = weights.squeeze(0)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
            weights = None

        out = self.out_proj(out.transpose(1, 2).reshape(N, L, self.embed_dim))
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights


def _has_opaque_weight(module: nn.Module) -> bool:
    """Whether the fused kernels would be handed a weight that is not a tensor, or would bypass a
    SparseMultiheadAttention (which is there to be sparsified: `in_proj` may become sparse later)."""
    return any(isinstance(m, SparseMultiheadAttention)
               or not isinstance(getattr(m, "weight", None), (torch.Tensor, type(None)))
               for m in module.modules())


def disable_fused_fast_paths(model: nn.Module) -> list[str]:
    """Make every nn.TransformerEncoder / nn.TransformerEncoderLayer of `model` that holds a
    non-tensor weight (a SparseLinear's format) or a SparseMultiheadAttention run its module-by-module
    path in eval mode too. Returns the names of the modules changed. Call it after sparsify().

    The fused eval paths (torch._transformer_encoder_layer_fwd, nested tensors) read the weights as
    tensors and never call the submodules. Each switch below is an attribute that only the fast-path
    check of torch/nn/modules/transformer.py reads, so the slow path is unchanged:
    - TransformerEncoderLayer.activation_relu_or_gelu = 0 trips "activation_relu_or_gelu was not True"
      (a stash of `activation`, used only by that check and the fused call; the slow path calls
      self.activation);
    - TransformerEncoder.use_nested_tensor = False trips "self.use_nested_tensor (set in init) was
      not True", so the encoder no longer packs the batch into a nested tensor for its layers.

    A plain nn.MultiheadAttention with a non-tensor weight raises TypeError: its slow path
    (F.multi_head_attention_forward) reads the weights as tensors too; use
    SparseMultiheadAttention.from_mha before sparsifying.
    """
    changed = []
    for name, m in model.named_modules():
        if isinstance(m, nn.MultiheadAttention):
            weights = (m.in_proj_weight, m.q_proj_weight, m.k_proj_weight, m.v_proj_weight, m.out_proj.weight)
            if not all(w is None or isinstance(w, torch.Tensor) for w in weights):
                raise TypeError(f"{name or 'model'}: nn.MultiheadAttention reads its projection weights as "
                                "tensors on every path; replace it with SparseMultiheadAttention.from_mha(...)")
        elif isinstance(m, nn.TransformerEncoderLayer) and m.activation_relu_or_gelu and _has_opaque_weight(m):
            m.activation_relu_or_gelu = 0
            changed.append(name)
        elif isinstance(m, nn.TransformerEncoder) and getattr(m, "use_nested_tensor", False) and _has_opaque_weight(m):
            m.use_nested_tensor = False
            changed.append(name)
    return changed
