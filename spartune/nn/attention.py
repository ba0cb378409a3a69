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


class SparseMultiheadAttention(nn.Module):
    """nn.MultiheadAttention's computation (same forward signature and outputs) with the packed
    in-projection held by `in_proj` = nn.Linear(E, 3E) and the out-projection by `out_proj`, both
    *called* as modules, so a SparseLinear swapped in by sparsify() is the one that runs.

    Reproduces MHA with kdim == vdim == embed_dim and no add_bias_kv / add_zero_attn. Its
    state_dict keys are `in_proj.weight`/`in_proj.bias`, not MHA's `in_proj_weight`/`in_proj_bias`;
    build one from a trained MHA with from_mha().
    """

    _qkv_same_embed_dim = True  # read by TransformerEncoder(Layer)'s fast-path checks
    # The fused encoder-layer path calls self_attn.merge_masks(src_mask, src_key_padding_mask, src)
    # (self-attention only, it assumes L == S); torch's own function needs nothing but self.num_heads.
    merge_masks = nn.MultiheadAttention.merge_masks

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim = self.kdim = self.vdim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias, device=device, dtype=dtype)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        # nn.MultiheadAttention's initialisation (out_proj keeps nn.Linear's weight init)
        nn.init.xavier_uniform_(self.in_proj.weight)
        if bias:
            nn.init.zeros_(self.in_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    # The names nn.MultiheadAttention has; TransformerEncoder(Layer) read them in their fast-path checks.
    @property
    def in_proj_weight(self):
        return self.in_proj.weight

    @property
    def in_proj_bias(self):
        return self.in_proj.bias

    @classmethod
    def from_mha(cls, mha: nn.MultiheadAttention) -> SparseMultiheadAttention:
        """A copy of `mha` (weights, device, dtype, dropout, batch_first, training flag)."""
        if not mha._qkv_same_embed_dim:
            raise NotImplementedError("SparseMultiheadAttention needs kdim == vdim == embed_dim "
                                      "(one packed in-projection); this MHA has separate q/k/v weights")
        if mha.bias_k is not None or mha.bias_v is not None:
            raise NotImplementedError("SparseMultiheadAttention does not reproduce add_bias_kv=True")
        if mha.add_zero_attn:
            raise NotImplementedError("SparseMultiheadAttention does not reproduce add_zero_attn=True")
        w = mha.in_proj_weight
        new = cls(mha.embed_dim, mha.num_heads, mha.dropout, bias=mha.in_proj_bias is not None,
                  batch_first=mha.batch_first, device="meta", dtype=w.dtype).to_empty(device=w.device)
        # built on "meta" (no init, no draw from the RNG): every tensor is copied below
        with torch.no_grad():
            new.in_proj.weight.copy_(w)
            new.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.in_proj_bias is not None:
                new.in_proj.bias.copy_(mha.in_proj_bias)
                new.out_proj.bias.copy_(mha.out_proj.bias)
        return new.train(mha.training)

    def _project(self, query, key, value):
        """q, k, v through `in_proj`. One call for self-attention. Otherwise each distinct input
        goes through the whole (3E, E) projection and keeps its third: a sparse weight cannot be
        sliced into its q/k/v rows, so cross-attention pays up to 3x the in-projection work."""
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
