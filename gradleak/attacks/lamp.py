"""LAMP: extracting text from gradients with language-model priors (Balunović, Dimitrov,
Jovanović, Vechev, NeurIPS 2022), for gradleak's GPT-2 (gradleak.models.gpt2) under FedSGD.

Continuous steps: Adam on input embeddings (as TAG, gradleak.attacks.tag) against the cosine
distance between simulated and observed gradients (1 − the mean per-parameter cosine), plus
`norm_weight` × (mean embedding norm / mean token-embedding norm − 1)², which keeps the
embeddings at the scale of real tokens. Discrete steps, every `discrete_every` steps: for each
sequence, `candidates` rearrangements of its positions (swap two, move one, move a span to
another place) are scored by the batch's gradient distance + `lm_weight` × the rearranged
sequence's mean negative log-likelihood per token under a language prior, and the best one
(the current order included) is kept, embeddings and all. Labels (the next tokens) are guessed
from the nearest tokens as in TAG, and every candidate is scored with its own.

The prior. The paper scores with GPT-2's perplexity; gradleak has no pretrained GPT-2, so a
bigram model counted on the `news` train split (which the test split's articles are not part
of) stands in for it, smoothed by interpolated absolute discounting with a continuation
unigram (Kneser-Ney's lower-order distribution, itself add-one smoothed).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

import torch

from ..data import DatasetSpec, load_dataset
from ..data.text import VOCAB_SIZE
from ..options import check
from ..threat import Observation
from .base import AttackContext, Reconstruction
from .tag import EmbeddingGradients, EmbeddingMatchingAttack, MatchingTrace

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


def cosine_distance(grads: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    """1 − the mean over parameters of the cosine between simulated and observed gradients."""
    total = grads[0].new_zeros(())
    for g, t in zip(grads, target):
        total = total + (g * t).sum() / (g.norm() * t.norm()).clamp_min(1e-12)
    return 1 - total / len(grads)


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
    # the same step budget as tag (about 0.3 s a step for batch 4 × 16 on one core); the
    # discrete steps add candidates × batch gradient evaluations each
    iterations: int = field(default=200, metadata={"range": (1, 1_000_000)})
    lr: float = field(default=0.01, metadata={"range": (0.0, 10.0)})
    norm_weight: float = field(default=1.0, metadata={"range": (0.0, 1e6)})
    lm_weight: float = field(default=0.05, metadata={"range": (0.0, 1e6)})  # λ on the log-perplexity
    discrete_every: int = field(default=50, metadata={"range": (1, 1_000_000)})
    candidates: int = field(default=6, metadata={"range": (1, 10_000)})  # rearrangements per sequence
    label_every: int = field(default=25, metadata={"range": (1, 1_000_000)})
    tokens: Literal["gradient", "all"] = "gradient"  # as tag's
    bag_threshold: float = field(default=0.01, metadata={"range": (0.0, 1.0)})

    def __post_init__(self) -> None:
        check(self.lr > 0, "attack 'lamp': lr must be > 0")


class LAMP(EmbeddingMatchingAttack):
    """LAMP: cosine matching with an embedding-norm prior, alternating with discrete
    rearrangements ranked by gradient distance plus a bigram language prior."""

    name = "lamp"
    Options = LampOptions

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        progress = MatchingTrace(opt.iterations, ctx)
        sim = self.simulator(obs, ctx)
        prior = news_bigram_prior()
        vocab_norm = sim.vocabulary.norm(dim=1).mean()
        batch, length = obs.batch_size, int(obs.input_shape[0])
        embeds = sim.random_embeddings((batch, length), ctx.generator(29)).requires_grad_(True)
        optimizer = torch.optim.Adam([embeds], lr=opt.lr)
        generator = ctx.generator(31)
        labels = sim.next_token_labels(sim.nearest_tokens(embeds))
        for step in range(opt.iterations):
            if step and step % opt.discrete_every == 0 and length > 1:
                with torch.no_grad():
                    embeds.copy_(self._discrete_step(sim, prior, embeds.detach(), generator))
                labels = sim.next_token_labels(sim.nearest_tokens(embeds))
            elif step and step % opt.label_every == 0:
                labels = sim.next_token_labels(sim.nearest_tokens(embeds))
            optimizer.zero_grad(set_to_none=True)
            matching = cosine_distance(sim(embeds, labels, create_graph=True), sim.target)
            scale = embeds.norm(dim=-1).mean() / vocab_norm - 1
            loss = matching + opt.norm_weight * scale.pow(2)
            loss.backward(inputs=[embeds])
            optimizer.step()
            progress.step(step, float(matching.detach()))
        return progress.reconstruction(sim.nearest_tokens(embeds))

    def _discrete_step(self, sim: EmbeddingGradients, prior: BigramPrior, embeds: torch.Tensor,
                       generator: torch.Generator) -> torch.Tensor:
        """The embeddings after keeping, sequence by sequence, the best-scoring rearrangement."""
        opt = self.options

        def score(candidate: torch.Tensor, row: int) -> float:
            tokens = sim.nearest_tokens(candidate)
            with torch.enable_grad():
                grads = sim(candidate, sim.next_token_labels(tokens), create_graph=False)
            language = prior.negative_log_likelihood(tokens[row:row + 1])[0]
            return float(cosine_distance(grads, sim.target)) + opt.lm_weight * float(language)

        for row in range(embeds.shape[0]):
            best, best_score = embeds, score(embeds, row)
            for _ in range(opt.candidates):
                candidate = embeds.clone()
                candidate[row] = embeds[row, rearrangement(embeds.shape[1], generator).to(embeds.device)]
                value = score(candidate, row)
                if value < best_score:
                    best, best_score = candidate, value
            embeds = best
        return embeds
