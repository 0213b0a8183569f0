"""LAMP: extracting text from gradients with language-model priors (Balunović, Dimitrov,
Jovanović, Vechev, NeurIPS 2022), for gradleak's GPT-2 (gradleak.models.gpt2) under FedSGD.

Start: the best of `init_candidates` random embeddings by gradient distance. Continuous steps:
Adam on input embeddings (as TAG, gradleak.attacks.text.tag) against the gradient distance, TAG's
‖Δ‖₂² + α‖Δ‖₁ (`loss=tag`, the paper's LAMP_L2+L1) or 1 − the mean per-parameter cosine
(`loss=cos`, LAMP_cos), plus `norm_weight` × (mean embedding norm / mean token-embedding norm −
1)², which keeps the embeddings at the scale of real tokens; the learning rate decays
exponentially to `lr_decay` × `lr` at the last step. The answer: the final embeddings'
nearest tokens. As TAG, a configuration of the optimisation engine (gradleak.attacks.engine):
the norm term is its `EmbeddingNorm` prior, the decay its exponential schedule, and the
discrete steps below a `Hook` every `discrete_every` steps.

Discrete steps, every `discrete_every` steps (0, the default: none): for each sequence,
`candidates` rearrangements of its positions (swap two, move one, move a span to another
place), then `exchanges` swaps of two tokens between sequences, each
kept when it lowers log(the gradient distance) + `lm_weight` × the sum of the sequences' mean
negative log-likelihoods per token under a language prior (of the nearest tokens); the
embeddings follow their tokens. `score=embeddings` (default, the paper's) takes the gradient
distance of the continuous embeddings so rearranged and returns the final nearest tokens;
`score=tokens` takes that of the nearest tokens' own embeddings and returns the best-scoring
guess seen at a discrete step or at the end. Labels (the next tokens) are guessed from the
nearest tokens as in TAG; every candidate is scored with its own.

The prior. The paper scores with GPT-2's perplexity; gradleak has no pretrained GPT-2, so a
bigram model counted on the `news` train split (which the test split's articles are not part
of) stands in for it, smoothed by interpolated absolute discounting with a continuation
unigram (Kneser-Ney's lower-order distribution, itself add-one smoothed). That prior is too
weak to steer the discrete steps: with them (every 25 steps) ROUGE-2 at batch 4 fell from 0.53
to 0.40 over 30 seeds, hence they are off by default (docs/text.md).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch

from ...data import DatasetSpec, load_dataset
from ...data.text import VOCAB_SIZE
from ...options import check
from ...threat import Observation
from ..base import AttackContext, Reconstruction
from ..engine.candidates import Embeddings
from ..engine.engine import Hook, Optimizer, Tensors
from ..engine.objectives import EmbeddingNorm, Prior, Seen
from .tag import EmbeddingGradients, EmbeddingMatchingAttack, l2_l1_distance, text_reconstruction

DISCOUNT = 0.75  # Kneser-Ney's usual absolute discount


class BigramPrior:
    """Interpolated Kneser-Ney-style bigram model over token ids."""

    def __init__(self, previous: torch.Tensor, following: torch.Tensor, vocab: int):
        self.vocab = vocab
        keys, counts = torch.unique(previous.long() * vocab + following.long(), return_counts=True)
        self.keys, self.counts = keys, counts.double()
        context = keys // vocab
        self.context_count = torch.bincount(context, weights=self.counts, minlength=vocab)
        self.context_types = torch.bincount(context, minlength=vocab).double()
        continuation = torch.bincount(keys % vocab, minlength=vocab).double()
        self.continuation = (continuation + 1) / (continuation.sum() + vocab)

    def log_prob(self, previous: torch.Tensor, following: torch.Tensor) -> torch.Tensor:
        """log p(following | previous), elementwise."""
        previous, following = previous.long().cpu(), following.long().cpu()
        query = previous * self.vocab + following
        index = torch.searchsorted(self.keys, query).clamp_max(self.keys.numel() - 1)
        pair = torch.where(self.keys[index] == query, self.counts[index], torch.zeros((), dtype=torch.float64))
        seen = self.context_count[previous]
        total = seen.clamp_min(1)
        backoff = torch.where(seen > 0, DISCOUNT * self.context_types[previous] / total, torch.ones(()))
        p = (pair - DISCOUNT).clamp_min(0) / total + backoff * self.continuation[following]
        return p.log()

    def negative_log_likelihood(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean −log p per predicted token of each row (B, T) → (B,): log-perplexity."""
        return -self.log_prob(tokens[:, :-1], tokens[:, 1:]).mean(dim=1).float()


@functools.lru_cache(maxsize=1)
def news_bigram_prior() -> BigramPrior:
    """The bigram prior counted on the news train split (every input and its next token)."""
    train = load_dataset(DatasetSpec("news", split="train"))
    return BigramPrior(train.inputs.flatten(), train.labels.flatten(), VOCAB_SIZE)


class BigramLanguage(Prior):
    """`weight` × the sum of the sequences' log-perplexities under a bigram model, a prior on
    token ids (B × T). It scores LAMP's discrete steps; it is no term of the continuous steps'
    loss, which has no gradient through the nearest tokens."""

    def __init__(self, weight: float, model: BigramPrior):
        self.weight, self.model = weight, model

    def per_sequence(self, tokens: torch.Tensor) -> torch.Tensor:
        """The weighted term of each sequence (B,)."""
        return self.weight * self.model.negative_log_likelihood(tokens)

    def __call__(self, seen: Seen) -> torch.Tensor:
        return self.model.negative_log_likelihood(seen.x).sum()


def cosine_distance(simulated: Tensors, target: Tensors) -> torch.Tensor:
    """1 − the mean over parameters of the cosine between simulated and observed gradients."""
    total = next(iter(target.values())).new_zeros(())
    for name, t in target.items():
        g = simulated[name]
        total = total + (g * t).sum() / (g.norm() * t.norm()).clamp_min(1e-12)
    return 1 - total / len(target)


def rearrangement(length: int, generator: torch.Generator) -> torch.Tensor:
    """A random order of `length` positions: swap two, move one, or move a span elsewhere."""
    order = list(range(length))
    kind = int(torch.randint(3, (1,), generator=generator))
    i, j = sorted(torch.randperm(length, generator=generator)[:2].tolist())
    if kind == 0:
        order[i], order[j] = order[j], order[i]
    elif kind == 1:
        order.insert(j, order.pop(i))
    else:
        span = order[i:j + 1]
        rest = order[:i] + order[j + 1:]
        at = int(torch.randint(len(rest) + 1, (1,), generator=generator))
        order = rest[:at] + span + rest[at:]
    return torch.tensor(order)


@dataclass(frozen=True)
class LampOptions:
    # the same step budget as tag (docs/text.md has its cost); the initial
    # candidates (and discrete steps, when on) add gradient evaluations without double backward
    iterations: int = field(default=1000, metadata={"range": (1, 1_000_000)})
    lr: float = field(default=0.01, metadata={"range": (0.0, 10.0)})
    loss: Literal["tag", "cos"] = "tag"  # the paper's LAMP_L2+L1 (tag's distance) or LAMP_cos
    alpha: float = field(default=0.01, metadata={"range": (0.0, 1e6)})  # L1 weight of loss=tag
    norm_weight: float = field(default=1.0, metadata={"range": (0.0, 1e6)})
    init_candidates: int = field(default=4, metadata={"range": (1, 10_000)})  # random starts, best kept
    lm_weight: float = field(default=0.2, metadata={"range": (0.0, 1e6)})  # λ on the log-perplexity
    # the learning rate decays exponentially to lr × lr_decay at the last step (1: constant)
    lr_decay: float = field(default=0.1, metadata={"range": (1e-6, 1.0)})
    # discrete candidates are scored by the gradient of their projected tokens' embeddings, or
    # of the continuous embeddings rearranged (the paper's)
    score: Literal["tokens", "embeddings"] = "embeddings"
    # Adam steps between discrete steps; 0: none. With the bigram prior standing in for the
    # paper's GPT-2 they cost ROUGE-2 at batch 4 (0.53 without, 0.40 with, 30 seeds; docs/text.md)
    discrete_every: int = field(default=0, metadata={"range": (0, 1_000_000)})
    candidates: int = field(default=8, metadata={"range": (1, 10_000)})  # rearrangements per sequence
    exchanges: int = field(default=0, metadata={"range": (0, 10_000)})  # swaps across sequences per step
    label_every: int = field(default=25, metadata={"range": (1, 1_000_000)})
    tokens: Literal["gradient", "all"] = "gradient"  # as tag's
    bag_threshold: float = field(default=0.01, metadata={"range": (0.0, 1.0)})

    def __post_init__(self) -> None:
        check(self.lr > 0, "attack 'lamp': lr must be > 0")


class TokenScorer:
    """Scores discrete guesses (token ids, B × T): log of the gradient distance their own
    token embeddings (or given continuous embeddings) produce + the `language` prior (the log
    keeps its weight meaningful for both distances, whose scales differ by orders). The batch
    gradient is the mean of per-sequence gradients (the loss is a mean over sequences of equal
    length), so changing one sequence costs one single-sequence gradient."""

    def __init__(self, sim: EmbeddingGradients, language: BigramLanguage, distance):
        self.sim, self.prior, self.distance = sim, language, distance

    def row_gradient(self, tokens: torch.Tensor, embeds: torch.Tensor | None = None) -> list[torch.Tensor]:
        """One sequence's gradient, from its tokens' embeddings or from `embeds` (T × width)."""
        row = tokens[None]
        inputs = self.sim.vocabulary[row] if embeds is None else embeds[None]
        with torch.enable_grad():
            grads = self.sim(inputs, self.sim.next_token_labels(row), create_graph=False)
        return [g.detach() for g in grads.values()]

    def matching(self, total: list[torch.Tensor], batch: int) -> float:
        mean = {n: g / batch for n, g in zip(self.sim.names, total)}
        return math.log(max(float(self.distance(mean, self.sim.target)), 1e-30))

    def language(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.prior.per_sequence(tokens)


class LAMP(EmbeddingMatchingAttack):
    """LAMP: gradient matching with an embedding-norm prior from the best of several random
    starts and a decaying learning rate; with `discrete_every` > 0, alternating with discrete
    rearrangements ranked by their gradient distance plus a bigram language prior (see the
    module doc)."""

    name = "lamp"
    Options = LampOptions

    def distance(self, simulated: Tensors, target: Tensors) -> torch.Tensor:
        if self.options.loss == "cos":
            return cosine_distance(simulated, target)
        return l2_l1_distance(simulated, target, self.options.alpha)

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        opt = self.options
        sim = self.simulator(obs, ctx)
        scorer = TokenScorer(sim, BigramLanguage(opt.lm_weight, news_bigram_prior()), self.distance) \
            if opt.discrete_every else None
        batch, length = obs.batch_size, int(obs.input_shape[0])
        candidate = sim.candidate(self._initial_embeddings(sim, (batch, length), ctx.generator(29)))
        generator = ctx.generator(31)
        best: list = [None, math.inf]  # score=tokens: the best-scoring guess of a discrete step, its score

        def discrete_step(candidate: Embeddings, iteration: int) -> None:
            """Rearrange the nearest tokens; the embeddings follow their tokens, the labels are re-guessed."""
            embeds = candidate.x
            tokens, score, source = self._discrete_step(scorer, candidate.tokens(), generator,
                                                        embeds.detach() if opt.score == "embeddings" else None)
            embeds.copy_(embeds.flatten(0, 1)[source.flatten()].view_as(embeds))
            if opt.score == "tokens" and score < best[1]:
                best[:] = [tokens, score]
            labels.update(candidate)

        hooks = [Hook(opt.discrete_every, discrete_step, start=opt.discrete_every)] \
            if scorer is not None and length > 1 else []
        # the learning rate decays exponentially to lr × lr_decay at the last step; later rungs go on at that rate
        engine, labels = self.engine(sim, candidate, ctx, hooks=hooks,
                                     optimizer=Optimizer("adam", opt.lr, "exponential", final_lr=opt.lr_decay),
                                     priors=[EmbeddingNorm(opt.norm_weight, sim.vocabulary.norm(dim=1).mean())])
        for out in engine.start().doublings(opt.iterations):
            final = sim.nearest_tokens(out.inputs)
            # score=tokens with discrete steps: the best-scoring guess, the final one included
            if scorer is not None and best[0] is not None:
                with torch.no_grad():
                    total = [sum(g) for g in zip(*(scorer.row_gradient(row) for row in final))]
                    score = scorer.matching(total, batch) + float(scorer.language(final).sum())
                if score > best[1]:
                    final = best[0]
            yield text_reconstruction(out, final)

    def _initial_embeddings(self, sim: EmbeddingGradients, shape: tuple[int, int],
                            generator: torch.Generator) -> torch.Tensor:
        """The random start (drawn like the embedding table) whose gradient is nearest the observed."""
        best, best_distance = None, math.inf
        for _ in range(self.options.init_candidates):
            embeds = sim.random_embeddings(shape, generator)
            with torch.enable_grad():
                grads = sim(embeds, sim.next_token_labels(sim.nearest_tokens(embeds)), create_graph=False)
            value = float(self.distance(grads, sim.target))
            if value < best_distance:
                best, best_distance = embeds, value
        return best

    def _discrete_step(self, scorer: TokenScorer, tokens: torch.Tensor, generator: torch.Generator,
                       embeds: torch.Tensor | None = None):
        """Sequence by sequence, the best of the current order and `candidates` rearrangements of
        its projected tokens; then `exchanges` swaps of two tokens between sequences, each kept
        when it scores better. With `embeds` (B × T × width), a candidate's gradient is that of
        the continuous embeddings moved as its tokens are; else that of its tokens' own. Returns
        the tokens, their score and, per position, the flat (batch × length) index of the
        position its embedding now comes from."""
        batch, length = tokens.shape
        embeds = None if embeds is None else embeds.clone()  # rows move below; the caller's stay

        def row_embeds(r: int, order: torch.Tensor | None = None) -> torch.Tensor | None:
            """Row r's continuous embeddings in `order`; None when the tokens are scored."""
            if embeds is None:
                return None
            return embeds[r] if order is None else embeds[r, order]

        rows = [scorer.row_gradient(row, row_embeds(r)) for r, row in enumerate(tokens)]
        total = [sum(g) for g in zip(*rows)]
        tokens = tokens.clone()
        source = torch.arange(batch * length, device=tokens.device).view(batch, length)
        language = scorer.language(tokens)
        current = scorer.matching(total, batch)
        for r in range(batch):
            others = [t - g for t, g in zip(total, rows[r])]
            best_order, best_grads = torch.arange(length, device=tokens.device), rows[r]
            best_score, best_matching = current + float(language[r]), current
            for _ in range(self.options.candidates):
                order = rearrangement(length, generator).to(tokens.device)
                candidate = tokens[r, order]
                grads = scorer.row_gradient(candidate, row_embeds(r, order))
                matching = scorer.matching([o + g for o, g in zip(others, grads)], batch)
                value = matching + float(scorer.language(candidate[None])[0])
                if value < best_score:
                    best_order, best_grads, best_score, best_matching = order, grads, value, matching
            tokens[r], source[r] = tokens[r, best_order], source[r, best_order]
            if embeds is not None:
                embeds[r] = embeds[r, best_order]
            language[r] = scorer.language(tokens[r:r + 1])[0]
            rows[r], current = best_grads, best_matching
            total = [o + g for o, g in zip(others, best_grads)]
        for _ in range(self.options.exchanges if batch > 1 else 0):
            r, q = torch.randperm(batch, generator=generator)[:2].tolist()
            i, j = torch.randint(length, (2,), generator=generator).tolist()
            if tokens[r, i] == tokens[q, j]:
                continue
            pair = tokens[[r, q]].clone()
            pair[0, i], pair[1, j] = tokens[q, j], tokens[r, i]
            if embeds is None:
                grads_r, grads_q = scorer.row_gradient(pair[0]), scorer.row_gradient(pair[1])
            else:
                pair_embeds = embeds[[r, q]].clone()
                pair_embeds[0, i], pair_embeds[1, j] = embeds[q, j], embeds[r, i]
                grads_r = scorer.row_gradient(pair[0], pair_embeds[0])
                grads_q = scorer.row_gradient(pair[1], pair_embeds[1])
            trial = [t - a - b + c + d for t, a, b, c, d in zip(total, rows[r], rows[q], grads_r, grads_q)]
            matching = scorer.matching(trial, batch)
            pair_language = scorer.language(pair)
            if matching + float(pair_language.sum()) < current + float(language[r] + language[q]):
                tokens[r], tokens[q] = pair[0], pair[1]
                if embeds is not None:
                    embeds[r], embeds[q] = pair_embeds[0], pair_embeds[1]
                source[r, i], source[q, j] = source[q, j].clone(), source[r, i].clone()
                language[r], language[q] = pair_language[0], pair_language[1]
                rows[r], rows[q], total, current = grads_r, grads_q, trial, matching
        return tokens, current + float(language.sum()), source
