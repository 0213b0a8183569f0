"""A GPT-2-style causal language model in plain PyTorch (Radford et al., 2019).

Token and learned position embeddings, pre-LayerNorm blocks (causal multi-head
self-attention with one fused Q/K/V input projection, then a 4×-wide GELU MLP, each
added to the residual stream), a final LayerNorm and either

* `head=lm`: a language-model head (tied to the token embedding by default) that
  returns next-token logits (B, T, vocab), or
* `head=classifier`: a linear layer on the last position's features, returning
  (B, classes) as GPT-2 sequence classifiers do;

`head=auto` picks lm when the data's classes are the vocabulary, else classifier.
Initialisation follows GPT-2: N(0, 0.02) weights, zero biases, and the two residual
output projections of every block scaled by 1/√(2·layers). No dropout: a FedSGD
update is one deterministic gradient. GPT-2 small is layers=12, width=768, heads=12;
the defaults are a CPU-sized 2 × 384 × 6 (23 M parameters, 85 % of them embeddings, 64 per
head as GPT-2): wide enough that DAGER recovers a batch of 16 sequences of 16 tokens (it
needs batch · length < width − 20, see gradleak.attacks.text.dager).

Attention is written out (no fused kernel) so that it has second derivatives, and
`Block.extend` runs the position after a prefix from the prefix's cached keys and values,
for one input there (incremental decoding) or many alternatives at once (DAGER's prefix
search, gradleak.attacks.text.dager).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import GradleakError
from ..options import build_options, check
from .base import TRANSFORMER_INIT_STD, ModelSpec, make_activation, size_checked, transformer_init

GPT2_VOCAB = 50257
GPT2_POSITIONS = 1024
INIT_STD = TRANSFORMER_INIT_STD


@dataclass(frozen=True)
class GPT2Options:
    layers: int = field(default=2, metadata={"range": (1, 48)})
    width: int = field(default=384, metadata={"range": (1, 4096)})  # d, the residual stream
    heads: int = field(default=6, metadata={"range": (1, 64)})
    vocab: int = field(default=GPT2_VOCAB, metadata={"range": (2, 1_000_000)})
    positions: int = field(default=GPT2_POSITIONS, metadata={"range": (1, 65_536)})  # longest sequence
    tied: bool = True  # LM head shares the token embedding matrix (as GPT-2)
    head: Literal["auto", "lm", "classifier"] = "auto"

    def __post_init__(self) -> None:
        check(self.width % self.heads == 0,
              f"model 'gpt2': width {self.width} must be a multiple of heads {self.heads}")


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees positions ≤ t."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)  # fused Q/K/V input projection (GPT-2's c_attn)
        self.proj = nn.Linear(width, width)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, D) → q, k, v of shape (B, heads, T, D / heads)."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        return tuple(z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(x)
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~causal, float("-inf"))
        out = scores.softmax(dim=-1) @ v
        b, h, _, hd = out.shape
        return self.proj(out.transpose(1, 2).reshape(b, t, h * hd))

    def extend(self, x: torch.Tensor, past_keys: torch.Tensor, past_values: torch.Tensor):
        """Attention at the position after a cached prefix, for m alternative inputs there.

        x (N or 1, m, D): m alternatives for the next position of each of N prefixes (one row
        shared by every prefix); past_keys / past_values (N, heads, P, D / heads). Each
        alternative attends to its prefix and itself, not to the other alternatives: m = 1 is
        ordinary incremental decoding. Returns (output (N, m, D), keys, values), the last two
        (N or 1, heads, m, D / heads) for the new position only.
        """
        q, k, v = self._split(x)
        past_scores = q @ past_keys.transpose(-2, -1)  # (N, heads, m, P)
        own_scores = (q * k).sum(dim=-1, keepdim=True).expand(*past_scores.shape[:-1], 1)
        weights = (torch.cat([past_scores, own_scores], dim=-1) / math.sqrt(q.shape[-1])).softmax(dim=-1)
        out = weights[..., :-1] @ past_values + weights[..., -1:] * v
        n, h, m, hd = out.shape
        return self.proj(out.transpose(1, 2).reshape(n, m, h * hd)), k, v


class MLP(nn.Module):
    def __init__(self, width: int, activation: nn.Module):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.act = activation
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """x + attn(ln_1(x)), then + mlp(ln_2(·)): GPT-2's pre-LN transformer block."""

    def __init__(self, width: int, heads: int, activation: nn.Module):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width, activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def extend(self, x: torch.Tensor, past_keys: torch.Tensor, past_values: torch.Tensor):
        """The block's output at the position after a cached prefix, for m alternative inputs
        there (see `CausalSelfAttention.extend`); returns (output (N, m, D), keys, values)."""
        attended, keys, values = self.attn.extend(self.ln_1(x), past_keys, past_values)
        x = x + attended
        return x + self.mlp(self.ln_2(x)), keys, values


class GPT2(nn.Module):
    """Token ids (B, T) → next-token logits (B, T, vocab), or class logits (B, classes)
    with a classifier head."""

    def __init__(self, *, vocab: int = GPT2_VOCAB, positions: int = GPT2_POSITIONS, layers: int = 2,
                 width: int = 384, heads: int = 6, tied: bool = True, classes: int | None = None,
                 activation: nn.Module | None = None):
        super().__init__()
        self.vocab, self.positions, self.width, self.heads = vocab, positions, width, heads
        self.token_embedding = nn.Embedding(vocab, width)
        self.position_embedding = nn.Embedding(positions, width)
        self.blocks = nn.ModuleList(Block(width, heads, activation or nn.GELU(approximate="tanh"))
                                    for _ in range(layers))
        self.final_norm = nn.LayerNorm(width)
        self.lm_head: nn.Linear | None = None
        self.classifier: nn.Linear | None = None
        if classes is None:
            self.lm_head = nn.Linear(width, vocab, bias=False)
        else:
            self.classifier = nn.Linear(width, classes)
        self._init_weights(layers)
        if self.lm_head is not None and tied:
            self.lm_head.weight = self.token_embedding.weight

    def _init_weights(self, layers: int) -> None:
        transformer_init(self, INIT_STD)
        with torch.no_grad():
            for block in self.blocks:  # residual projections: GPT-2's 1/√(2·layers) scaling
                block.attn.proj.weight.normal_(0.0, INIT_STD / math.sqrt(2 * layers))
                block.mlp.proj.weight.normal_(0.0, INIT_STD / math.sqrt(2 * layers))

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token + position embeddings (B, T, D): the residual stream entering block 0."""
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise GradleakError(f"gpt2 takes integer token ids of shape (batch, length); got "
                                f"{tuple(tokens.shape)} {tokens.dtype}")
        if tokens.shape[1] > self.positions:
            raise GradleakError(f"gpt2: {tokens.shape[1]} tokens exceed its {self.positions} positions")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.token_embedding(tokens) + self.position_embedding(positions)

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final-LayerNorm features (B, T, D)."""
        return self._run_blocks(self.embed(tokens))

    def _run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        if self.classifier is not None:
            return self.classifier(h[:, -1])
        return self.lm_head(h)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._head(self.features(tokens))

    def forward_embeddings(self, embeds: torch.Tensor) -> torch.Tensor:
        """The model's output from token embeddings (B, T, D) given in place of the lookup
        (position embeddings are still added): what optimisation attacks on text (TAG, LAMP)
        differentiate through. `forward(tokens)` equals `forward_embeddings(token_embedding(tokens))`."""
        if embeds.dim() != 3 or embeds.shape[-1] != self.width:
            raise GradleakError(f"gpt2 takes embeddings of shape (batch, length, {self.width}); "
                                f"got {tuple(embeds.shape)}")
        if embeds.shape[1] > self.positions:
            raise GradleakError(f"gpt2: {embeds.shape[1]} positions exceed its {self.positions}")
        positions = torch.arange(embeds.shape[1], device=embeds.device)
        return self._head(self._run_blocks(embeds + self.position_embedding(positions)))


def language_model_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token logits (B, T, V) against target ids (B, T)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@size_checked
def build_gpt2(spec: ModelSpec) -> nn.Module:
    """GPT-2-style causal LM over token sequences (next-token or classifier head).

    Sequences of length spec.input_shape[0]; an LM head when spec.num_classes equals the
    vocabulary (head=auto), else a classifier head."""
    opts: GPT2Options = build_options(GPT2Options, spec.options, "model 'gpt2'")
    shape = tuple(int(d) for d in spec.input_shape)
    if len(shape) != 1:
        raise GradleakError(f"model 'gpt2' needs token sequences, input shape (length,); got {shape}")
    if shape[0] > opts.positions:
        raise GradleakError(f"model 'gpt2': sequences of {shape[0]} tokens exceed positions={opts.positions}")
    head = opts.head
    if head == "auto":
        head = "lm" if spec.num_classes == opts.vocab else "classifier"
    if head == "lm" and spec.num_classes != opts.vocab:
        raise GradleakError(f"model 'gpt2' with head=lm predicts {opts.vocab} tokens, but the data has "
                            f"{spec.num_classes} classes; use head=classifier")
    activation = make_activation(spec.activation) if spec.activation is not None else None
    return GPT2(vocab=opts.vocab, positions=opts.positions, layers=opts.layers, width=opts.width,
                heads=opts.heads, tied=opts.tied, classes=None if head == "lm" else spec.num_classes,
                activation=activation)
