"""What the optimisation engine (`engine`) optimises, and the inputs it stands for:
the pixels themselves, a low-dimensional latent code with its decoder (ROG), or
the weights of an untrained generator (a deep image prior), or the input embeddings
of a token sequence (TAG, LAMP); and the labels, fixed, optimised with the inputs
(DLG's soft labels) or guessed from the candidate as it goes (a language model's next
tokens)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Candidate(ABC):
    """What the engine optimises, and the inputs it stands for."""

    @abstractmethod
    def variables(self) -> list[torch.Tensor]:
        """The leaf tensors the optimizer updates."""

    @abstractmethod
    def inputs(self) -> torch.Tensor:
        """The candidate inputs (differentiable in `variables`)."""

    def project(self) -> None:
        """Keep the variables feasible after a step (e.g. pixels in [0, 1])."""

    def snapshot(self) -> list[torch.Tensor]:
        return [v.detach().clone() for v in self.variables()]

    def restore(self, saved: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for v, s in zip(self.variables(), saved):
                v.copy_(s)


class Pixels(Candidate):
    """The inputs themselves; `box`: kept in [0, 1] (images), from the start."""

    def __init__(self, start: torch.Tensor, box: bool = False):
        self.box = box
        self.x = (start.clamp(0, 1) if box else start).clone().requires_grad_(True)

    def variables(self) -> list[torch.Tensor]:
        return [self.x]

    def inputs(self) -> torch.Tensor:
        return self.x

    def project(self) -> None:
        if self.box:
            with torch.no_grad():
                self.x.clamp_(0, 1)


class Latent(Candidate):
    """A code z decoded to inputs, x = decode(z) (ROG's bicubic latent); `box`: z in [0, 1]."""

    def __init__(self, start: torch.Tensor, decode: Callable[[torch.Tensor], torch.Tensor], box: bool = False):
        self.z = start.detach().clone().requires_grad_(True)
        self.decode, self.box = decode, box

    def variables(self) -> list[torch.Tensor]:
        return [self.z]

    def inputs(self) -> torch.Tensor:
        return self.decode(self.z)

    def project(self) -> None:
        if self.box:
            with torch.no_grad():
                self.z.clamp_(0, 1)


class Network(Candidate):
    """The weights of a generator applied to fixed (or also optimised) noise: a deep image prior."""

    def __init__(self, generator: nn.Module, noise: torch.Tensor, train_noise: bool = False):
        self.generator, self.noise = generator, noise.requires_grad_(train_noise)
        self.train_noise = train_noise

    def variables(self) -> list[torch.Tensor]:
        return list(self.generator.parameters()) + ([self.noise] if self.train_noise else [])

    def inputs(self) -> torch.Tensor:
        return self.generator(self.noise)


class Embeddings(Candidate):
    """Input embeddings of token sequences (B × T × width), fed to a text model past its token
    lookup (TAG, LAMP): the tokens are unknown, so their continuous embeddings are optimised,
    and `tokens()` maps each position to the token whose embedding is nearest by cosine among
    `ids` (default: every row of `table`, the token-embedding rows they may map to)."""

    def __init__(self, start: torch.Tensor, table: torch.Tensor, ids: torch.Tensor | None = None):
        self.x = start.detach().clone().requires_grad_(True)
        self.ids = torch.arange(len(table), device=table.device) if ids is None else ids
        self.unit = F.normalize(table.detach(), dim=-1)

    def variables(self) -> list[torch.Tensor]:
        return [self.x]

    def inputs(self) -> torch.Tensor:
        return self.x

    def tokens(self) -> torch.Tensor:
        return nearest_tokens(self.x, self.unit, self.ids)


def nearest_tokens(embeddings: torch.Tensor, unit_table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """At every position, the id of the row of `unit_table` (unit-norm token embeddings, one
    per id) nearest by cosine."""
    return ids[(F.normalize(embeddings.detach(), dim=-1) @ unit_table.T).argmax(dim=-1)]


class FixedLabels:
    """Labels known or recovered before the optimisation."""

    def __init__(self, labels: torch.Tensor):
        self.labels = labels

    def variables(self) -> list[torch.Tensor]:
        return []

    def current(self) -> torch.Tensor:
        return self.labels

    def hard(self) -> torch.Tensor:
        return self.labels


class GuessedLabels(FixedLabels):
    """Labels the server does not know, guessed from the candidate: `guess(candidate)` on the
    starting candidate, then again at each `update` (an engine `Hook`, every few steps). A
    causal language model's labels are the next tokens of its inputs (TAG, LAMP)."""

    def __init__(self, guess: Callable[[Candidate], torch.Tensor], start: Candidate):
        self.guess = guess
        self.labels = guess(start)

    def update(self, candidate: Candidate, iteration: int = 0) -> None:
        self.labels = self.guess(candidate)


class SoftLabels(FixedLabels):
    """Label logits optimised with the inputs; the simulated update sees softmax(logits) (DLG)."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits.detach().clone().requires_grad_(True)

    def variables(self) -> list[torch.Tensor]:
        return [self.logits]

    def current(self) -> torch.Tensor:
        return self.logits.softmax(-1)

    def hard(self) -> torch.Tensor:
        return self.logits.detach().argmax(-1)


class ArrangedLabels(FixedLabels):
    """A known multiset of labels whose arrangement over the rows is optimised: which example
    of a FedAvg client's batch sat in which mini-batch decides each step's label mix, which the
    recovered label counts alone do not tell. Rows in one `group` (an epoch whose order the
    server does not know, or all example slots) share a soft permutation — Sinkhorn-normalised
    logits, doubly stochastic, so every group keeps the counts — of the `labels` over their
    `slot`s; the simulated update sees the soft labels, `hard()` the best permutation."""

    def __init__(self, labels: torch.Tensor, num_classes: int, slot: torch.Tensor, group: torch.Tensor,
                 generator: torch.Generator | None = None, sinkhorn_iterations: int = 20):
        n, groups = len(labels), int(group.max()) + 1
        self.onehot = nn.functional.one_hot(labels.long(), num_classes).to(torch.get_default_dtype())
        self.labels_list, self.slot, self.group = labels, slot, group
        noise = torch.randn((groups, n, n), generator=generator) * 0.01
        self.logits = noise.to(labels.device).requires_grad_(True)
        self.sinkhorn_iterations = sinkhorn_iterations

    def variables(self) -> list[torch.Tensor]:
        return [self.logits]

    def arrangement(self) -> torch.Tensor:
        log_p = self.logits
        for _ in range(self.sinkhorn_iterations):
            log_p = log_p - log_p.logsumexp(-1, keepdim=True)
            log_p = log_p - log_p.logsumexp(-2, keepdim=True)
        return log_p.exp()

    def current(self) -> torch.Tensor:
        soft = self.arrangement() @ self.onehot.to(self.logits.device)  # (groups, slots, classes)
        return soft[self.group, self.slot]

    def hard(self) -> torch.Tensor:
        from scipy.optimize import linear_sum_assignment

        out = torch.empty(len(self.slot), dtype=torch.long)
        logits = self.logits.detach().cpu()
        for g in range(logits.shape[0]):
            slots, picks = linear_sum_assignment(-logits[g].numpy())
            chosen = torch.empty(len(slots), dtype=torch.long)
            chosen[torch.as_tensor(slots)] = self.labels_list.cpu()[torch.as_tensor(picks)].long()
            rows = (self.group.cpu() == g).nonzero().flatten()
            out[rows] = chosen[self.slot.cpu()[rows]]
        return out.to(self.labels_list.device)
