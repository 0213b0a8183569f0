"""DAGER for encoders (Petrov, Dimitrov, Baader, Müller, Vechev, NeurIPS 2024): exact
recovery of a batch of WordPiece sentences from one FedSGD gradient of the BERT-style
`minilm` (gradleak.models.minilm), with the span test of gradleak.attacks.text.dager; a FedAvg
delta and LoRA adapters (`layer_span`) are read as that module reads a decoder's.

Layer 1 is the decoder case: the first block's Q/K/V projections read
h = LN_emb(E[token] + P[position] + T[segment 0]) (the embedding LayerNorm's output: MiniLM is
post-LN), so the span of their stacked weight gradients holds h(v, p) for every (token,
position) of the batch, and each position's candidates C_p are the tokens whose h(v, p) lies
in it (`dager.FirstLayerInputs`, with P[p] + T[0] as the position vector). Padding is
masked out of attention and pooling, so padded positions add nothing to any gradient; a
sentence ends where `[SEP]` passes the test at position l (its tokens are 0..l).

Layer 2 differs: attention is bidirectional, so the second block's input at a position
depends on the whole sentence and no prefix can be tested alone. As the paper does for
BERT, for every end l the candidate sentences `[CLS] c_1 … c_{l−1} [SEP]` (c_p ∈ C_p) are
run through the first block on their own (padding is masked, so a sentence's states do not
depend on its batch) and scored by the mean distance of their block-1 outputs to the
layer-2 span; the best distinct sentences of each length are kept. The paper enumerates the
product of the C_p, or samples it at random beyond 10⁷ combinations (on a GPU). Here the
product is enumerated up to `EXHAUSTIVE_LIMIT` sentences; beyond it a coordinate search
replaces the sampling: from several starts (the k-th nearest candidate at every position,
then seeded random choices) each position in turn takes the candidate that minimises the
sentence's mean distance, until a sweep changes nothing. A wrong token moves mainly its
own position's block-1 output off the span, which is what lets one-position moves find
the sentence.

A sentence is exact when every one of its positions passes the layer-2 test
(`l2_threshold`). The result holds the exact sentences first (nearest first), then the best
remaining ones that differ from every kept sentence in at least 30 % of their positions
(the paper's `distinct_thresh` 0.7), until there are `batch_size` rows. Lengths are searched
longest first, and the search stops once `batch_size` exact sentences are found: they are the
whole batch.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from ...errors import GradleakError
from ...models.lora import LoRALinear
from ...models.minilm import CLS_ID, PAD_ID, SEP_ID, MiniLM
from ...threat import Observation
from ..base import AttackContext, Reconstruction
from .dager import (
    DagerOptions,
    FirstLayerInputs,
    InputSpan,
    ProjectedFirstLayerInputs,
    adapter_span,
    check_search_size,
    input_span,
)

EXHAUSTIVE_LIMIT = 256  # candidate sentences of one length scored one by one; above: coordinate search
RANDOM_STARTS = 64  # coordinate-search starts beyond the batch_size "k-th nearest" ones
ESCALATED_STARTS = 256  # a second pass over every length when fewer than batch_size exact sentences were found
PATIENCE = 2  # coordinate-search rounds in a row that may find no new exact sentence
MAX_SWEEPS = 8
DISTINCT = 0.7  # two sentences agreeing at this fraction of positions count as one (DAGER's distinct_thresh)
CHUNK_TOKENS = 1 << 14  # sentence positions per block-1 call (MLP activations: 25 MB of float32)
SEARCH_SEED = 0


def qkv_gradient_names(layer: int) -> tuple[str, str, str]:
    """Parameter names of block `layer`'s query, key and value weights in gradleak's MiniLM."""
    return tuple(f"blocks.{layer}.attn.{part}.weight" for part in ("query", "key", "value"))


@dataclass
class EncoderResult:
    tokens: torch.Tensor  # (B, T) recovered WordPiece ids, [PAD] after [SEP]; exact rows first
    exact: torch.Tensor  # (B,) bool: every position passed the layer-2 span test
    distances: torch.Tensor  # (B,) mean layer-2 distance of the row (NaN when saturated)
    ranks: tuple[int, int]
    saturated: bool
    candidates: list[int]  # layer-1 candidates per position
    lengths: list[int]  # positions of [SEP] that passed the layer-1 test (sentence ends)


def check_encoder(model) -> None:
    if not isinstance(model, MiniLM):
        raise GradleakError(f"dager's encoder search needs gradleak's MiniLM (model minilm), "
                            f"got {type(model).__name__}")
    if len(model.blocks) < 2:
        raise GradleakError("dager on minilm needs at least 2 blocks (minilm:layers=2 or more): "
                            "the second block checks whole sentences")


def _stacked_gradient(gradients: dict[str, torch.Tensor], layer: int, width: int) -> torch.Tensor:
    parts = []
    for name in qkv_gradient_names(layer):
        if name not in gradients:
            raise GradleakError(f"dager needs the gradient of '{name}'")
        if tuple(gradients[name].shape) != (width, width):
            raise GradleakError(f"dager: gradient '{name}' has shape {tuple(gradients[name].shape)}, "
                                f"expected {(width, width)}")
        parts.append(gradients[name])
    return torch.cat(parts, dim=0)


def layer_span(model: MiniLM, gradients: dict[str, torch.Tensor], layer: int, max_rank: int,
               options: DagerOptions, extra_rank: int = 0) -> InputSpan:
    """Block `layer`'s input span. Plain projections: the stacked query/key/value weight
    gradients. LoRA adapters on them, read as gradleak.attacks.text.dager reads the decoder's: while
    every B is nonzero the stacked A gradients span the inputs (at most r of them); with zero
    B, the query's B gradient spans the projected inputs A x. The adapters' rank must exceed
    the inputs' count, else one line says so."""
    attn = model.blocks[layer].attn
    parts = [getattr(attn, part) for part in ("query", "key", "value")]
    if not isinstance(parts[0], LoRALinear):
        return input_span(_stacked_gradient(gradients, layer, model.width), max_rank, options,
                          extra_rank=extra_rank)
    prefix = f"blocks.{layer}.attn"
    names = [f"{prefix}.{part}.lora_{matrix}" for matrix in "AB" for part in ("query", "key", "value")]
    _check_gradients(gradients, names, [getattr(part, f"lora_{matrix}") for matrix in "AB" for part in parts])
    stacked_a = torch.cat([gradients[n] for n in names[:3]])
    use_a = all(bool(part.lora_B.detach().abs().max() > 0) for part in parts)
    return adapter_span(stacked_a, gradients[f"{prefix}.query.lora_B"], parts[0], use_a, max_rank, options,
                        extra_rank, layer)


def _check_gradients(gradients: dict[str, torch.Tensor], names: list[str], params: list[torch.Tensor]) -> None:
    for name, param in zip(names, params):
        if name not in gradients:
            raise GradleakError(f"dager needs the gradient of '{name}'")
        if tuple(gradients[name].shape) != tuple(param.shape):
            raise GradleakError(f"dager: gradient '{name}' has shape {tuple(gradients[name].shape)}, "
                                f"expected {tuple(param.shape)}")


def _first_layer(model: MiniLM, span: InputSpan) -> FirstLayerInputs:
    """The layer-1 test of gradleak.attacks.text.dager on MiniLM's embeddings: its `ln_1` is the
    embedding LayerNorm and its position vectors are P[p] + T[0]."""
    positions = model.position_embedding.weight + model.type_embedding.weight[0]
    view = SimpleNamespace(blocks=[SimpleNamespace(ln_1=model.embedding_norm)],
                           token_embedding=model.token_embedding,
                           position_embedding=SimpleNamespace(weight=positions))
    return (ProjectedFirstLayerInputs if span.projection is not None else FirstLayerInputs)(view, span)


def layer2_distances(model: MiniLM, sentences: torch.Tensor, span: InputSpan) -> torch.Tensor:
    """Distance (float64, (n, L)) of the first block's output at every position of each
    unpadded sentence (n, L) to the layer-2 span."""
    device = model.token_embedding.weight.device
    length = sentences.shape[1]
    rows = max(1, CHUNK_TOKENS // length)
    positions = model.position_embedding.weight[:length] + model.type_embedding.weight[0]
    out = []
    for start in range(0, sentences.shape[0], rows):
        chunk = sentences[start:start + rows].to(device)
        x = model.embedding_norm(model.token_embedding(chunk) + positions)
        out.append(span.distance(model.blocks[0](x).double().cpu()))
    return torch.cat(out)


def _exhaustive(model: MiniLM, options: list[torch.Tensor], span: InputSpan) -> tuple[torch.Tensor, torch.Tensor]:
    grid = torch.tensor(list(itertools.product(*[o.tolist() for o in options])), dtype=torch.long)
    return grid, layer2_distances(model, grid, span)


def _position_distances(model: MiniLM, states: torch.Tensor, position: int, choices: torch.Tensor,
                        span: InputSpan) -> torch.Tensor:
    """Layer-2 distance (float64, (n, m)) at `position` alone of each sentence (n, L) with that
    position set to each of `choices` (m): the first block at one query, the other positions'
    keys and values taken from the sentence."""
    block, attn = model.blocks[0], model.blocks[0].attn
    n, length = states.shape
    heads, width = attn.heads, model.width
    hd = width // heads
    device = model.token_embedding.weight.device
    positions = model.position_embedding.weight[:length] + model.type_embedding.weight[0]
    x = model.embedding_norm(model.token_embedding(states.to(device)) + positions)  # (n, L, D)
    xc = model.embedding_norm(model.token_embedding(choices.to(device)) + positions[position])  # (m, D)
    keys = attn.key(x).view(n, length, heads, hd)
    values = attn.value(x).view(n, length, heads, hd)
    qc, kc, vc = (f(xc).view(-1, heads, hd) for f in (attn.query, attn.key, attn.value))
    scale = 1.0 / math.sqrt(hd)
    scores = torch.einsum("mhe,nlhe->nmhl", qc, keys) * scale  # (n, m, heads, L)
    scores[..., position] = ((qc * kc).sum(-1) * scale)[None]
    weights = scores.softmax(dim=-1)
    own = weights[..., position, None] * vc[None]  # (n, m, heads, hd)
    weights = weights.clone()
    weights[..., position] = 0
    mixed = torch.einsum("nmhl,nlhe->nmhe", weights, values) + own
    h = block.attn_norm(xc[None] + attn.output(mixed.reshape(n, -1, width)))
    out = block.out_norm(h + block.proj(block.act(block.fc(h))))
    return span.distance(out.double().cpu().reshape(-1, width)).view(n, -1)


def _coordinate_search(model: MiniLM, options: list[torch.Tensor], span: InputSpan, batch_size: int,
                       generator: torch.Generator, avoid: list[list[int]], random_starts: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sentences from one-position-at-a-time descent: each position in turn takes the candidate
    whose block-1 output there is nearest the layer-2 span, the other positions fixed. The
    starts are the k-th nearest candidates at every position that no sentence of `avoid` holds
    there (DAGER's non-overlap heuristic, as a start rather than a filter), then random choices
    among those."""
    fresh = []
    for j, o in enumerate(options):
        taken = torch.tensor([row[j] for row in avoid], dtype=torch.long)
        unused = o[~torch.isin(o, taken)] if avoid else o
        fresh.append(unused if unused.numel() else o)
    starts = [torch.stack([o[min(k, o.numel() - 1)] for o in fresh]) for k in range(batch_size)]
    starts += [torch.stack([o[torch.randint(o.numel(), (1,), generator=generator)[0]] for o in fresh])
               for _ in range(random_starts)]
    states = torch.unique(torch.stack(starts), dim=0)
    for _ in range(MAX_SWEEPS):
        before = states.clone()
        for j, choices in enumerate(options):
            if choices.numel() > 1:
                states[:, j] = choices[_position_distances(model, states, j, choices, span).argmin(dim=1)]
        states = torch.unique(states, dim=0)
        if states.shape == before.shape and torch.equal(states, before):
            break
    return states, layer2_distances(model, states, span)


def _search_length(model: MiniLM, choices: list[torch.Tensor], span: InputSpan, batch_size: int, threshold: float,
                   starts: int, seed: int, pool: dict[tuple[int, ...], torch.Tensor]) -> None:
    """Rounds of coordinate search for sentences of one length, each started away from the exact
    sentences found so far, until PATIENCE rounds in a row find no new one; adds every
    converged sentence and its layer-2 distances to `pool`."""
    generator = torch.Generator().manual_seed(seed)
    exact_rows = [list(row) for row, d in pool.items() if bool((d < threshold).all())]
    idle = 0
    while len(exact_rows) < batch_size and idle < PATIENCE:
        rows, dists = _coordinate_search(model, choices, span, batch_size, generator, exact_rows, starts)
        new = 0
        for row, dist in zip(rows.tolist(), dists):
            if tuple(row) not in pool:
                pool[tuple(row)] = dist
                if bool((dist < threshold).all()):
                    exact_rows.append(row)
                    new += 1
        idle = 0 if new else idle + 1


def _agree(a: list[int], b: list[int]) -> bool:
    """Whether two sentences count as one: the same at ≥ DISTINCT of the longer's positions."""
    same = sum(x == y for x, y in zip(a, b))
    return same >= DISTINCT * max(len(a), len(b))


def encoder_search(model: MiniLM, gradients: dict[str, torch.Tensor], batch_size: int, seq_len: int,
                   options: DagerOptions | None = None, *, fedavg: bool = False) -> EncoderResult:
    """Recover the `batch_size` WordPiece sentences (padded to `seq_len`) behind a FedSGD
    gradient of `model` (the first two blocks' query/key/value weight gradients, or their LoRA
    adapters', are read). `fedavg`: a FedAvg delta read as the decoder's is
    (gradleak.attacks.text.dager: `fedavg_extra_rank` more span directions, the FedAvg thresholds)."""
    options = options or DagerOptions()
    check_encoder(model)
    check_search_size(model, batch_size, seq_len, options, shortest=2)  # [CLS] and [SEP]
    if fedavg:
        options = dataclasses.replace(options, l1_threshold=options.fedavg_l1_threshold,
                                      l2_threshold=options.fedavg_l2_threshold)
    max_rank = batch_size * seq_len
    extra_rank = options.fedavg_extra_rank if fedavg else 0
    span1, span2 = (layer_span(model, gradients, layer, max_rank, options, extra_rank) for layer in (0, 1))
    saturated = span1.saturated or span2.saturated
    with torch.no_grad():
        first = _first_layer(model, span1)
        limit = options.candidate_limit(batch_size, seq_len)
        candidates = [first.candidates(p, options.l1_threshold, limit, fallback=batch_size) for p in range(seq_len)]
        counts = [int(c.numel()) for c in candidates]
        if saturated:
            rows = torch.stack([c[torch.arange(batch_size) % c.numel()] for c in candidates], dim=1)
            return EncoderResult(rows, torch.zeros(batch_size, dtype=torch.bool),
                                 torch.full((batch_size,), float("nan"), dtype=torch.float64),
                                 (span1.rank, span2.rank), True, counts, [])
        sep = torch.tensor([SEP_ID])
        ends = [p for p in range(1, seq_len)
                if float(first.exact_distances(sep.to(first.tokens.device), p)[0]) < options.l1_threshold]
        if not ends:  # no [SEP] passed: the batch's sentences were cut at seq_len
            ends = [seq_len - 1]
        choices = {}
        for end in ends:
            inner = []
            for p in range(1, end):
                c = candidates[p][(candidates[p] != SEP_ID) & (candidates[p] != CLS_ID) & (candidates[p] != PAD_ID)]
                inner.append(c if c.numel() else candidates[p][:1])
            choices[end] = [torch.tensor([CLS_ID])] + inner + [sep]
        pools: dict[int, dict[tuple[int, ...], torch.Tensor]] = {end: {} for end in ends}

        def exact_count() -> int:
            return sum(bool((d < options.l2_threshold).all()) for pool in pools.values() for d in pool.values())

        # longest first (sentences cut at seq_len end last); B exact sentences are the whole batch,
        # so the search stops there
        for starts in (RANDOM_STARTS, ESCALATED_STARTS):
            for end in sorted(ends, reverse=True):
                if math.prod(c.numel() for c in choices[end]) <= EXHAUSTIVE_LIMIT:
                    if not pools[end]:
                        rows, dists = _exhaustive(model, choices[end], span2)
                        pools[end].update(zip(map(tuple, rows.tolist()), dists))
                else:
                    _search_length(model, choices[end], span2, batch_size, options.l2_threshold, starts,
                                   SEARCH_SEED + end + starts, pools[end])
                if exact_count() >= batch_size:
                    break
            if exact_count() >= batch_size:
                break  # else: one more pass with more starts
        ends = [end for end in ends if pools[end]]
        found: list[tuple[bool, float, list[int]]] = []
        for end in ends:
            sentences = torch.tensor(list(pools[end]), dtype=torch.long)
            distances = torch.stack(list(pools[end].values()))
            mean = distances.mean(dim=1)
            exact = (distances < options.l2_threshold).all(dim=1)
            kept: list[list[int]] = []
            for i in sorted(range(sentences.shape[0]), key=lambda i: (not bool(exact[i]), float(mean[i]))):
                row = sentences[i].tolist()
                if any(_agree(row, k) for k in kept):
                    continue
                kept.append(row)
                found.append((bool(exact[i]), float(mean[i]), row))
                if len(kept) == batch_size:
                    break
    found.sort(key=lambda item: (not item[0], item[1]))
    chosen: list[tuple[bool, float, list[int]]] = []
    for item in found:
        if item[0] or not any(_agree(item[2], c[2]) for c in chosen):
            chosen.append(item)
        if len(chosen) == batch_size:
            break
    if not chosen:
        raise GradleakError("dager: no sentence survived the search")
    tokens = torch.full((batch_size, seq_len), PAD_ID, dtype=torch.long)
    for b in range(batch_size):
        row = chosen[b % len(chosen)][2]
        tokens[b, :len(row)] = torch.tensor(row, dtype=torch.long)
    exact = torch.tensor([chosen[b % len(chosen)][0] for b in range(batch_size)])
    distances = torch.tensor([chosen[b % len(chosen)][1] for b in range(batch_size)], dtype=torch.float64)
    return EncoderResult(tokens, exact, distances, (span1.rank, span2.rank), False, counts, ends)


def is_encoder(model) -> bool:
    """Whether `model` is an encoder that DAGER's encoder search reads (gradleak's MiniLM)."""
    return isinstance(model, MiniLM)


def reconstruct_encoder(obs: Observation, ctx: AttackContext, options: DagerOptions) -> Reconstruction:
    """Attack 'dager' on minilm: `encoder_search` on one FedSGD gradient or FedAvg delta."""
    check_encoder(obs.model)
    batch_size, seq_len = obs.batch_size, int(obs.input_shape[0])
    model = copy.deepcopy(obs.model).to(ctx.device)
    result = encoder_search(model, obs.update.as_gradient(), batch_size, seq_len, options,
                            fedavg=obs.update.kind != "gradient")
    extras = {"exact_rows": int(result.exact.sum()), "span_ranks": list(result.ranks),
              "candidates_per_position": result.candidates, "sentence_ends": result.lengths}
    if result.saturated:
        extras["saturated"] = (f"the batch's layer inputs fill the {model.width}-wide model's span (DAGER needs "
                               f"fewer than width − {options.rank_margin}): no token can be told apart; attack a "
                               "smaller batch or shorter sequences (--seq-len)")
    return Reconstruction(inputs=result.tokens.cpu(), labels=None, extras=extras)
