"""DAGER: exact gradient inversion for decoder language models (Petrov, Dimitrov, Baader,
Müller, Vechev, NeurIPS 2024), for gradleak's GPT-2 (gradleak.models.gpt2) under FedSGD,
FedAvg and LoRA fine-tuning.

Span test. A linear layer's weight gradient is Σ δ xᵀ over every (sequence, position) the
layer saw, so its rows lie in the span of those inputs x. The inputs of the first block's
Q/K/V projection are h = LN₁(E[token] + P[position]): at most B·T distinct vectors, a
subspace of rank r ≤ B·T. While r stays well below the width d, a vocabulary token v at
position p was in the batch when h(v, p) lies in that span: its distance to the span
relative to its norm is rounding-level, while an unrelated token's is of order √((d − r)/d).
The span comes from the gradient's SVD: as many leading right singular vectors as singular
values above `rank_tolerance` of the largest, at most B·T and d − `rank_margin` (DAGER's
rank cutoff). Missing a weak true direction breaks exactness while a few spurious ones barely
move anyone's distance, so the tolerance sits just above float32's rounding floor.

1. Layer 1, per position p: the tokens whose h(v, p) passes (distance < `l1_threshold`) are
   the candidates C_p. Every vocabulary token is tested through the layer norm's algebra: one
   (V × d)·(d × 64) product, shared by all positions, gives a lower bound of each token's
   distance (its part along 64 directions orthogonal to the span); only tokens whose bound
   is small are tested exactly, in float64.
2. Layer 2, DAGER's greedy extension for decoders: the second block's Q/K/V gradient spans
   the second block's inputs LN₁'(block₁(·)), which at position p depend on tokens 0..p only
   (causal attention). Starting from the empty prefix, every surviving prefix is extended by
   every token of C_p; block 1 runs on the new position against the prefix's cached keys and
   values, and the extensions whose block-2 input lies in the span (distance <
   `l2_threshold`) survive. The prefixes alive at p = T − 1 are the recovered sequences.
   The second block must not be the last one of a classifier (whose gradient only sees the
   last position): such a model needs three blocks.

When fewer than B sequences survive (a duplicate sequence in the batch, a token the span test
missed, a noised gradient), a second search also carries the B best failing extensions along
(ranked by mean distance) and fills the missing rows from them; those rows are flagged not
exact. When a span fills d − rank_margin dimensions (more distinct inputs than the width
allows) no token can be told apart: the result is flagged `saturated` and row b holds, at
each position, the b-th nearest token to the span, without a search.

FedAvg. A client that runs several SGD steps sends w_start − w_end = lr · Σ_k g_k, the
gradients taken at moving weights: the Q/K/V rows of the delta lie in the span of the layer
inputs of every step, h_k = LN_k(E_k[v] + P_k[p]), which drift from the inputs at the weights
the server sent as the embeddings and layer norms are trained. As DAGER does, the span test
runs at the server's (starting) weights on the delta (any scale), the spans keep
`fedavg_extra_rank` directions beyond B·T to hold the drift, and both tests use the looser
`fedavg_l1_threshold` / `fedavg_l2_threshold`. The drift grows with lr × steps, and exact
recovery degrades once it is no longer small against the distance of unrelated tokens
(docs/text.md has the measurements). With mini-batches, a sequence first seen after the first
step entered the delta only at weights the earlier steps had moved: its rows are the first
to fail as lr grows. Adam, AdamW and weight decay rescale or shrink the weights
elementwise and are refused in one line when the server knows the client's optimizer.

LoRA. A client that trains LoRA adapters (`gradleak.models.lora`, W + (α/r) B A on each
block's Q/K/V projection, the base frozen) sends only A and B. While every B is nonzero (a
fine-tuning in progress) A's gradient (α/r) Bᵀ Σ δ xᵀ has its rows in the span of the inputs
x, rank ≤ r: DAGER's tests run on it unchanged, as long as r exceeds the number of distinct
inputs. A fresh adapter (B = 0, Hu et al.'s initialisation) has a zero A gradient; B's
gradient (α/r) Σ δ (A x)ᵀ spans the projected inputs A x in r dimensions, so every test
projects its inputs through the known A first (r must exceed the inputs plus `rank_margin`).
A rank too small for the batch is refused in one line.

Padding is no special case: GPT-2 pads with `<|endoftext|>`, an ordinary token at its
positions, recovered like any other (drop trailing pads when decoding). Every sequence of the
batch has the same length T, as a padded batch does.

Over 400 lines: about 65 are this docstring's account of the algorithm.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ...errors import GradleakError
from ...models.gpt2 import GPT2
from ...models.lora import LoRALinear
from ...options import check

PREFILTER_DIRECTIONS = 64  # directions orthogonal to the layer-1 span in the cheap lower bound
# the lower bound is computed in float32: accept up to twice the threshold there so rounding
# cannot drop a true token before the exact float64 test
PREFILTER_SLACK = 2.0
CHUNK_FLOATS = 1 << 25  # MLP activations per block call (128 MB of float32)


def qkv_gradient_name(layer: int) -> str:
    """Parameter name of block `layer`'s fused Q/K/V projection weight in gradleak's GPT-2."""
    return f"blocks.{layer}.attn.qkv.weight"


@dataclass(frozen=True)
class DagerOptions:
    # distance to the span / norm below which a layer-1 input (token at a position) is in the batch,
    # between the true inputs' and the other tokens' distances on float32 gradients (docs/text.md)
    l1_threshold: float = field(default=1e-3, metadata={"range": (0.0, 1.0)})
    # the same for the layer-2 input of a prefix extended by one token
    l2_threshold: float = field(default=1e-3, metadata={"range": (0.0, 1.0)})
    # singular values below this fraction of the largest count as rounding noise, not rank
    # (between float32's floor and the weakest true direction: docs/text.md)
    rank_tolerance: float = field(default=1e-7, metadata={"range": (0.0, 1.0)})
    # keep every span at least this many dimensions short of the width (DAGER's rank cutoff)
    rank_margin: int = field(default=20, metadata={"range": (1, 4096)})
    # layer-1 candidates kept per position (nearest first); 0: batch · length, as many tokens as
    # the batch holds (a batch token passes at every position linked to its own, see
    # `FirstLayerInputs`)
    max_candidates: int = field(default=0, metadata={"range": (0, 1_000_000)})
    # prefixes that pass the layer-2 test kept per position (nearest first); 0: 4·batch + 16
    max_prefixes: int = field(default=0, metadata={"range": (0, 1_000_000)})
    # FedAvg (a delta of several local steps): span directions kept beyond batch · length, for
    # the inputs' drift over the steps (DAGER keeps 60 more), and the looser thresholds the
    # drift needs (docs/text.md has the distances they sit between)
    fedavg_extra_rank: int = field(default=120, metadata={"range": (0, 4096)})
    fedavg_l1_threshold: float = field(default=5e-2, metadata={"range": (0.0, 1.0)})
    fedavg_l2_threshold: float = field(default=2e-2, metadata={"range": (0.0, 1.0)})

    def __post_init__(self) -> None:
        check(self.l1_threshold > 0, "attack 'dager': l1_threshold must be > 0")
        check(self.l2_threshold > 0, "attack 'dager': l2_threshold must be > 0")
        check(self.rank_tolerance > 0, "attack 'dager': rank_tolerance must be > 0")
        check(self.fedavg_l1_threshold > 0 and self.fedavg_l2_threshold > 0,
              "attack 'dager': fedavg_l1_threshold and fedavg_l2_threshold must be > 0")

    def candidate_limit(self, batch_size: int, seq_len: int) -> int:
        return self.max_candidates or batch_size * seq_len

    def prefix_limit(self, batch_size: int) -> int:
        return self.max_prefixes or 4 * batch_size + 16


def adapter_span(a_gradient: torch.Tensor, b_gradient: torch.Tensor, adapter: LoRALinear, use_a: bool,
                 max_rank: int, options: DagerOptions, extra_rank: int, block: int) -> InputSpan:
    """The input span of one LoRA adapter's layer (see `_layer_spans`): from A's gradient (its
    rows span the inputs) when `use_a`, else from B's gradient, which spans the projected inputs
    A x. One line when the adapter's rank cannot hold the batch's inputs."""
    rank = adapter.rank
    if use_a:
        span = input_span(a_gradient, max_rank, options, extra_rank=extra_rank, limit=rank)
        needs = f"more than the batch's at most {max_rank} distinct inputs"
    else:
        limit = rank - options.rank_margin
        if limit < 1:
            raise GradleakError(f"dager: a LoRA adapter of rank {rank} with zero B leaves no room for a span "
                                f"(the rank must exceed rank_margin {options.rank_margin} plus the inputs)")
        span = input_span(b_gradient, max_rank, options, extra_rank=extra_rank, limit=limit,
                          projection=adapter.lora_A)
        needs = f"at least {max_rank + options.rank_margin + 1} (the batch's inputs + rank_margin)"
    if span.saturated:
        raise GradleakError(f"dager: the LoRA rank {rank} is too small to span the batch's layer inputs "
                            f"(block {block}: up to {max_rank} distinct token positions); it needs a rank of "
                            f"{needs}: attack a larger --lora rank, a smaller batch or shorter sequences")
    return span


@dataclass
class DagerResult:
    tokens: torch.Tensor  # (B, T) recovered token ids, exact rows first
    exact: torch.Tensor  # (B,) bool: the row passed the layer-2 span test at every position
    distances: torch.Tensor  # (B,) mean layer-2 distance ratio of the row (NaN when saturated)
    ranks: tuple[int, int]  # span dimensions used for layers 1 and 2
    saturated: bool  # a span reached d − rank_margin: no token can be told apart, no search ran
    candidates: list[int]  # layer-1 candidates per position


@dataclass
class InputSpan:
    """Orthonormal bases (float64, columns) of a layer's input span and of its complement."""

    basis: torch.Tensor  # (d, r)
    complement: torch.Tensor  # (d, d − r)
    estimated_rank: int  # singular values above the tolerance
    saturated: bool
    # (r, d) float64: the span holds the projected inputs A x, not x (a LoRA adapter's B gradient)
    projection: torch.Tensor | None = None

    @property
    def rank(self) -> int:
        return self.basis.shape[1]

    def distance(self, x: torch.Tensor) -> torch.Tensor:
        """Distance of each row of x (projected, with a projection) to the span, relative to
        the row's norm (float64)."""
        x = x.to(self.complement)
        if self.projection is not None:
            x = x @ self.projection.to(x).T
        return (x @ self.complement).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-300)


def input_span(gradient: torch.Tensor, max_rank: int, options: DagerOptions, *, extra_rank: int = 0,
               limit: int | None = None, projection: torch.Tensor | None = None) -> InputSpan:
    """The span of a linear layer's inputs from its weight gradient (out × in): the leading
    right singular vectors, as many as singular values above the tolerance, capped at
    `max_rank` (B·T) + `extra_rank` and at `limit` (default in − rank_margin). Saturated when
    the inputs (at most `max_rank`) reach the limit."""
    g = gradient.detach().to("cpu", torch.float64)
    if not torch.isfinite(g).all():
        raise GradleakError("dager: the gradient holds NaN or infinite values")
    _, singular, vh = torch.linalg.svd(g, full_matrices=True)
    if singular.numel() == 0 or singular[0] == 0:
        raise GradleakError("dager: the Q/K/V projection's gradient is zero; there is nothing to invert")
    width = g.shape[1]
    estimated = int((singular > options.rank_tolerance * singular[0]).sum())
    limit = width - options.rank_margin if limit is None else limit
    rank = min(estimated, max_rank + extra_rank, limit)
    v = vh.T
    return InputSpan(v[:, :rank].contiguous(), v[:, rank:].contiguous(), estimated,
                     saturated=min(estimated, max_rank) >= limit,
                     projection=None if projection is None else projection.detach().to("cpu", torch.float64))


class FirstLayerInputs:
    """h(v, p) = LN₁(E[v] + P[p]) for every vocabulary token v, tested against the layer-1 span.

    LN(x) = γ ⊙ (x − mean x) / σ(x) + β is affine in the centred x up to the scalar 1/σ, and
    x = E[v] + P[p] is a sum, so the components of h(v, p) along any fixed directions, σ and ‖h‖
    come from per-token tables computed once and per-position vectors: O(V·d) per position.

    The same algebra limits what layer 1 can tell: the batch's inputs span (up to β)
    γ ⊙ span{E[v_i] + P[p_i]}, which also holds E[v] + P[q] for a batch token v at any position
    q linked to one of v's positions through other batch tokens (E[v] + P[q] = (E[v] + P[p])
    − (E[w] + P[p]) + (E[w] + P[q])). Once two sequences share a token, layer 1 passes most
    of the batch's tokens at most positions; layer 2, whose inputs mix positions through
    attention, sorts them out.
    """

    def __init__(self, model: GPT2, span: InputSpan):
        self._read_layer(model, span)
        centred = self.centred
        # lower bound: the part of h along the first directions orthogonal to the span
        self.directions = span.complement[:, :PREFILTER_DIRECTIONS].to(self.tokens)
        self.token_part = (centred * self.gamma) @ self.directions  # (V, k)
        self.beta_part = self.beta @ self.directions
        self.square = centred.pow(2).sum(dim=1)
        self.gamma_square = (centred.pow(2) * self.gamma.pow(2)).sum(dim=1)
        self.gamma_beta = centred @ (self.gamma * self.beta)

    def _read_layer(self, model: GPT2, span: InputSpan) -> None:
        """The first block's layer norm, the embeddings and the span, as float32 tables."""
        ln = model.blocks[0].ln_1
        self.eps = ln.eps
        self.gamma = ln.weight.detach().float()
        self.beta = ln.bias.detach().float()
        self.tokens = model.token_embedding.weight.detach().float()
        self.positions = model.position_embedding.weight.detach().float()
        self.span = span
        self.width = self.tokens.shape[1]
        self.centred = self.tokens - self.tokens.mean(dim=1, keepdim=True)

    def exact_distances(self, token_ids: torch.Tensor, position: int) -> torch.Tensor:
        x = self.tokens[token_ids].double() + self.positions[position].double()
        h = F.layer_norm(x, (self.width,), self.gamma.double(), self.beta.double(), self.eps)
        return self.span.distance(h)

    def candidates(self, position: int, threshold: float, limit: int, fallback: int) -> torch.Tensor:
        """Token ids (CPU) whose input at `position` lies in the span, nearest first (at most
        `limit`); when none does, the `fallback` nearest tokens."""
        p = self.positions[position] - self.positions[position].mean()
        cross = self.centred @ p
        sigma = ((self.square + 2 * cross + p.pow(2).sum()) / self.width + self.eps).sqrt()
        gamma_p = self.gamma * p
        norm_sq = ((self.gamma_square + 2 * (self.centred @ (self.gamma * gamma_p)) + gamma_p.pow(2).sum())
                   / sigma.pow(2)
                   + 2 * (self.gamma_beta + (self.gamma * self.beta) @ p) / sigma + self.beta.pow(2).sum())
        part = (self.token_part + gamma_p @ self.directions) / sigma[:, None] + self.beta_part
        bound = part.norm(dim=1) / norm_sq.clamp_min(1e-30).sqrt()
        return self._chosen(bound, position, threshold, limit, fallback)

    def _sigma(self, p: torch.Tensor) -> torch.Tensor:
        return ((self.square + 2 * (self.centred @ p) + p.pow(2).sum()) / self.width + self.eps).sqrt()

    def _chosen(self, bound: torch.Tensor, position: int, threshold: float, limit: int,
                fallback: int) -> torch.Tensor:
        """From a float32 lower bound of every token's distance: the tokens that pass the exact
        float64 test, nearest first (at most `limit`), or the `fallback` nearest."""
        survivors = torch.nonzero(bound < PREFILTER_SLACK * threshold).flatten()
        if survivors.numel() == 0:
            survivors = bound.topk(min(4 * fallback, bound.numel()), largest=False).indices
        exact = self.exact_distances(survivors, position)
        order = exact.argsort()
        passing = order[exact[order] < threshold]
        chosen = passing[:limit] if passing.numel() else order[:fallback]
        return survivors.cpu()[chosen]


class ProjectedFirstLayerInputs(FirstLayerInputs):
    """The layer-1 test against a span of projected inputs A h(v, p) (a LoRA adapter's B
    gradient): A h = (A diag γ)(E[v] + P[p] − means) / σ + A β, so a (V × r) table per token,
    computed once, and an r-vector per position give every token's projected input; its
    distance to the span is computed for all tokens in float32, then exactly for the
    survivors."""

    def __init__(self, model: GPT2, span: InputSpan):
        self._read_layer(model, span)
        self.square = self.centred.pow(2).sum(dim=1)
        projection = span.projection.to(self.tokens)  # (r, d)
        self.scaled = projection * self.gamma  # A diag γ
        self.table = self.centred @ self.scaled.T  # (V, r)
        self.projected_beta = projection @ self.beta
        self.complement = span.complement.to(self.tokens)

    def candidates(self, position: int, threshold: float, limit: int, fallback: int) -> torch.Tensor:
        p = self.positions[position] - self.positions[position].mean()
        sigma = self._sigma(p)
        projected = (self.table + self.scaled @ p) / sigma[:, None] + self.projected_beta
        bound = (projected @ self.complement).norm(dim=1) / projected.norm(dim=1).clamp_min(1e-30)
        return self._chosen(bound, position, threshold, limit, fallback)


def check_architecture(model) -> None:
    if not isinstance(model, GPT2):
        raise GradleakError(f"dager needs gradleak's GPT-2 (gradleak.models.gpt2.GPT2, model gpt2), "
                            f"got {type(model).__name__}")
    if len(model.blocks) < 2:
        raise GradleakError("dager needs at least 2 transformer blocks (the second one checks whole prefixes)")
    if model.classifier is not None and len(model.blocks) < 3:
        # a classifier reads the last position only, so the last block's gradient sees no prefix
        raise GradleakError("dager on a classifier head needs at least 3 transformer blocks (gpt2:layers=3): "
                            "the last block's gradient sees only the last position")


def check_search_size(model, batch_size: int, seq_len: int, options: DagerOptions, shortest: int = 1) -> None:
    """One line for a batch, a length or a rank margin the model cannot be searched with."""
    if batch_size < 1 or not shortest <= seq_len <= model.positions:
        raise GradleakError(f"dager: batch_size must be ≥ 1 and seq_len within {shortest}..{model.positions}; "
                            f"got {batch_size}, {seq_len}")
    if options.rank_margin >= model.width:
        raise GradleakError(f"dager: rank_margin {options.rank_margin} leaves no span in width {model.width}")


def _check_inputs(model, gradients: dict[str, torch.Tensor], batch_size: int, seq_len: int,
                  options: DagerOptions) -> None:
    check_architecture(model)
    check_search_size(model, batch_size, seq_len, options)
    for layer in (0, 1):
        qkv = model.blocks[layer].attn.qkv
        names = ([f"{_qkv_prefix(layer)}.lora_A", f"{_qkv_prefix(layer)}.lora_B"] if isinstance(qkv, LoRALinear)
                 else [qkv_gradient_name(layer)])
        for name in names:
            if name not in gradients:
                raise GradleakError(f"dager needs the gradient of '{name}'")
            expected = tuple(dict(qkv.named_parameters())[name.rpartition(".")[2]].shape)
            if tuple(gradients[name].shape) != expected:
                raise GradleakError(f"dager: gradient '{name}' has shape {tuple(gradients[name].shape)}, "
                                    f"expected {expected}")


def _qkv_prefix(layer: int) -> str:
    return f"blocks.{layer}.attn.qkv"


def _layer_spans(model: GPT2, gradients: dict[str, torch.Tensor], max_rank: int, options: DagerOptions,
                 extra_rank: int) -> tuple[InputSpan, InputSpan]:
    """The input spans of the first two blocks' Q/K/V projections. A plain projection's weight
    gradient spans its inputs. A LoRA adapter's (W + (α/r) B A): while every B is nonzero, A's
    gradient (α/r) Bᵀ Σ δ xᵀ spans the inputs as DAGER reads it (at most r of them); with a
    zero B (a fresh adapter) A's gradient is zero and B's, (α/r) Σ δ (A x)ᵀ, spans the
    projected inputs A x in r dimensions. Either way the adapter's rank must exceed the inputs'
    count: otherwise one line says so."""
    qkvs = [model.blocks[layer].attn.qkv for layer in (0, 1)]
    if not isinstance(qkvs[0], LoRALinear):
        return tuple(input_span(gradients[qkv_gradient_name(layer)], max_rank, options, extra_rank=extra_rank)
                     for layer in (0, 1))
    use_a = all(bool(qkv.lora_B.detach().abs().max() > 0) for qkv in qkvs)
    spans = [adapter_span(gradients[f"{_qkv_prefix(layer)}.lora_A"], gradients[f"{_qkv_prefix(layer)}.lora_B"],
                          qkv, use_a, max_rank, options, extra_rank, layer) for layer, qkv in enumerate(qkvs)]
    return spans[0], spans[1]


@dataclass
class _Beam:
    """Prefixes alive after a position, with the first block's cached keys and values."""

    tokens: torch.Tensor  # (n, p) token ids
    keys: torch.Tensor  # (n, heads, p, d / heads)
    values: torch.Tensor
    distance_sum: torch.Tensor  # (n,) float64: layer-2 distances summed over positions
    exact: torch.Tensor  # (n,) bool: every position passed the layer-2 test

    def take(self, parents: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
             distances: torch.Tensor, exact: torch.Tensor) -> "_Beam":
        """The beam one position on: prefixes `parents` extended by `tokens` (new keys and values
        (n, heads, 1, d / heads), their layer-2 distances and test outcomes)."""
        on_device = parents.to(self.keys.device)
        return _Beam(torch.cat([self.tokens[parents], tokens[:, None]], dim=1),
                     torch.cat([self.keys[on_device], keys], dim=2),
                     torch.cat([self.values[on_device], values], dim=2),
                     self.distance_sum[parents] + distances, self.exact[parents] & exact)


def _layer2_distances(model: GPT2, beam: _Beam, candidates: torch.Tensor, position: int,
                      span: InputSpan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer-2 distances (prefixes × candidates, float64 on the CPU) of every prefix extended
    by every candidate token at `position`, and the candidates' keys and values there
    ((heads, m, d / heads): the new position's Q/K/V do not depend on the prefix)."""
    embeddings = model.token_embedding.weight
    x = (embeddings[candidates.to(embeddings.device)] + model.position_embedding.weight[position]).unsqueeze(0)
    block, next_norm = model.blocks[0], model.blocks[1].ln_1
    rows = max(1, CHUNK_FLOATS // (4 * model.width * candidates.numel()))  # the MLP's hidden layer
    distances, keys, values = [], None, None
    for start in range(0, beam.tokens.shape[0], rows):
        out, keys, values = block.extend(x, beam.keys[start:start + rows], beam.values[start:start + rows])
        distances.append(span.distance(next_norm(out).double().cpu()))
    return torch.cat(distances), keys[0], values[0]


def _search(model: GPT2, candidates: list[torch.Tensor], span: InputSpan, threshold: float,
            prefix_limit: int, approximate: int) -> _Beam:
    """DAGER's greedy left-to-right extension; with `approximate` > 0 the best failing
    extensions (by mean distance) also live on, at most that many per position."""
    weight = model.token_embedding.weight
    empty = weight.new_zeros(1, model.heads, 0, model.width // model.heads)
    beam = _Beam(torch.zeros(1, 0, dtype=torch.long), empty, empty.clone(),
                 torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.bool))
    for position, tokens in enumerate(candidates):
        distances, keys, values = _layer2_distances(model, beam, tokens, position, span)
        mean = (beam.distance_sum[:, None] + distances) / (position + 1)
        passing = beam.exact[:, None] & (distances < threshold)
        flat_mean, flat_passing = mean.flatten(), passing.flatten()
        keep = torch.nonzero(flat_passing).flatten()
        keep = keep[flat_mean[keep].argsort()][:prefix_limit]
        if approximate:
            failing = torch.nonzero(~flat_passing).flatten()
            keep = torch.cat([keep, failing[flat_mean[failing].argsort()][:approximate]])
        parents, chosen = keep // tokens.numel(), keep % tokens.numel()
        on_device = chosen.to(keys.device)
        beam = beam.take(parents, tokens[chosen], keys[:, on_device].transpose(0, 1).unsqueeze(2),
                         values[:, on_device].transpose(0, 1).unsqueeze(2), distances.flatten()[keep],
                         flat_passing[keep])
        if beam.tokens.shape[0] == 0:
            break
    return beam


def dager_search(model: GPT2, gradients: dict[str, torch.Tensor], batch_size: int, seq_len: int,
                 options: DagerOptions | None = None, *, fedavg: bool = False) -> DagerResult:
    """Recover the `batch_size` token sequences of length `seq_len` behind a FedSGD gradient of
    `model` (parameter name → gradient; the first two blocks' Q/K/V weights, or their LoRA
    adapters, are read). `fedavg`: the gradients are a FedAvg delta (any positive scale) and
    `model` holds the weights the client started from; the spans keep `fedavg_extra_rank`
    more directions and the tests use the FedAvg thresholds (see the module doc)."""
    options = options or DagerOptions()
    _check_inputs(model, gradients, batch_size, seq_len, options)
    if fedavg:
        options = dataclasses.replace(options, l1_threshold=options.fedavg_l1_threshold,
                                      l2_threshold=options.fedavg_l2_threshold)
    max_rank = batch_size * seq_len
    span1, span2 = _layer_spans(model, gradients, max_rank, options, options.fedavg_extra_rank if fedavg else 0)
    saturated = span1.saturated or span2.saturated
    with torch.no_grad():
        first = (ProjectedFirstLayerInputs if span1.projection is not None else FirstLayerInputs)(model, span1)
        limit = options.candidate_limit(batch_size, seq_len)
        candidates = [first.candidates(p, options.l1_threshold, limit, fallback=batch_size)
                      for p in range(seq_len)]
        counts = [int(c.numel()) for c in candidates]
        if saturated:
            # every token lies (nearly) in the span: report the nearest ones, no search
            rows = torch.stack([c[torch.arange(batch_size) % c.numel()] for c in candidates], dim=1)
            return DagerResult(rows, torch.zeros(batch_size, dtype=torch.bool),
                               torch.full((batch_size,), float("nan"), dtype=torch.float64),
                               (span1.rank, span2.rank), True, counts)
        prefix_limit = options.prefix_limit(batch_size)
        beam = _search(model, candidates, span2, options.l2_threshold, prefix_limit, approximate=0)
        if beam.tokens.shape[0] < batch_size:
            beam = _search(model, candidates, span2, options.l2_threshold, prefix_limit, approximate=batch_size)
    if beam.tokens.shape[0] == 0:
        raise GradleakError("dager: no sequence survived the search")
    mean = beam.distance_sum / seq_len
    # exact rows first, each group nearest first
    order = sorted(range(beam.tokens.shape[0]), key=lambda i: (not bool(beam.exact[i]), float(mean[i])))
    # fewer distinct sequences than rows (only possible when candidates are scarce): repeat them
    index = torch.tensor([order[i % len(order)] for i in range(batch_size)])
    return DagerResult(beam.tokens[index], beam.exact[index], mean[index], (span1.rank, span2.rank), False, counts)


def dager_reconstruct(model: GPT2, gradients: dict[str, torch.Tensor], batch_size: int, seq_len: int,
                      options: DagerOptions | None = None) -> torch.Tensor:
    """The (batch_size, seq_len) token ids DAGER recovers from a FedSGD gradient (see `dager_search`)."""
    return dager_search(model, gradients, batch_size, seq_len, options).tokens
