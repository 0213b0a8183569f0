"""TAG: gradient attack on transformer-based language models (Deng et al., Findings of EMNLP
2021), for gradleak's GPT-2 (gradleak.models.gpt2) under FedSGD.

The client's tokens are unknown, so TAG optimises continuous input embeddings instead, one
vector per position (B × T × width), fed to the model in place of the token-embedding lookup
(`GPT2.forward_embeddings`). Adam minimises the distance between the gradient they produce
and the observed one, ‖Δ‖₂² + α‖Δ‖₁ summed over parameters (α = 0.01, the paper's); at the
end each position's vector is mapped to the vocabulary token whose embedding is nearest by
cosine.

What is matched. Every parameter's gradient except the token embedding's: its observed
gradient holds the lookup's contribution at the client's (unknown) tokens, which embeddings fed
past the lookup cannot produce (with a tied LM head that is the head's gradient too).

Labels. A causal LM's labels are the next tokens, which the server does not know. They are
taken from the current guess, as breaching does: every `label_every` steps the embeddings are
mapped to their nearest tokens, position t's label becomes the token guessed at t + 1, and the
last position's label the model's own prediction there; in between, the labels stay fixed.

Which tokens. The observed token-embedding gradient has a large row for every token the batch
holds (as input through the lookup, as label through the tied LM head) and a row about a
thousand times smaller for every other token (the softmax's share only). `tokens=gradient`
(default) keeps the tokens whose row norm exceeds `bag_threshold` × the largest as the only
candidates for labels and the final mapping; `tokens=all` searches the whole vocabulary, the
paper's setting, where guessed labels rarely settle on the right tokens (docs/text.md).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Iterator, Literal

import torch
import torch.nn.functional as F

from ...errors import GradleakError
from ...models.gpt2 import GPT2
from ...options import check
from ...threat import Observation
from ..base import Attack, AttackContext, Reconstruction, check_result

TRACE_POINTS = 20  # matching distances kept in the trace


def check_text_model(model, attack: str) -> None:
    """TAG and LAMP feed embeddings to gradleak's GPT-2 and guess next-token labels: they need its LM head."""
    if not isinstance(model, GPT2):
        raise GradleakError(f"{attack} needs gradleak's GPT-2 (gradleak.models.gpt2.GPT2, model gpt2), "
                            f"got {type(model).__name__}")
    if model.lm_head is None:
        raise GradleakError(f"{attack} needs gpt2 with a language-model head (next-token labels), "
                            "not a classifier head")


def check_fedsgd(obs: Observation, attack: str) -> None:
    if obs.update.kind != "gradient":
        raise GradleakError(f"attack '{attack}' matches one FedSGD gradient (--local-steps 1); "
                            "FedAvg updates are not supported")


def matched_gradients(model: GPT2, observed: dict[str, torch.Tensor]) -> list[str]:
    """Names of the parameters whose gradients are matched (all but the token embedding)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad and n != "token_embedding.weight"]
    missing = [n for n in names if n not in observed]
    if missing:
        raise GradleakError(f"the observed update lacks the gradient of '{missing[0]}'")
    return names


class EmbeddingGradients:
    """The FedSGD gradient (mean next-token cross-entropy) that input embeddings produce."""

    def __init__(self, model: GPT2, observed: dict[str, torch.Tensor], device: torch.device):
        self.model = model
        self.names = matched_gradients(model, observed)
        params = dict(model.named_parameters())
        self.params = [params[n] for n in self.names]
        self.target = [observed[n].detach().to(device, torch.float32) for n in self.names]
        self.vocabulary = model.token_embedding.weight.detach()
        self.candidates = torch.arange(self.vocabulary.shape[0], device=self.vocabulary.device)
        self.unit_vocabulary = F.normalize(self.vocabulary, dim=-1)

    @classmethod
    def for_options(cls, model: GPT2, observed: dict[str, torch.Tensor], device: torch.device,
                    options: "TagOptions") -> "EmbeddingGradients":
        sim = cls(model, observed, device)
        if options.tokens == "gradient":
            sim.restrict_to_batch_tokens(observed, options.bag_threshold)
        return sim

    def restrict_to_batch_tokens(self, observed: dict[str, torch.Tensor], threshold: float) -> None:
        """Keep as candidates only the tokens whose observed embedding-gradient row stands out."""
        if "token_embedding.weight" not in observed:
            raise GradleakError("the observed update lacks the token embedding's gradient; use tokens=all")
        rows = observed["token_embedding.weight"].detach().to(self.vocabulary.device).float().norm(dim=1)
        if not torch.isfinite(rows).all() or float(rows.max()) == 0:
            raise GradleakError("the token embedding's gradient is zero or not finite; use tokens=all")
        self.candidates = torch.nonzero(rows > threshold * rows.max()).flatten()
        self.unit_vocabulary = F.normalize(self.vocabulary[self.candidates], dim=-1)

    def __call__(self, embeds: torch.Tensor, labels: torch.Tensor, create_graph: bool) -> list[torch.Tensor]:
        logits = self.model.forward_embeddings(embeds)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return list(torch.autograd.grad(loss, self.params, create_graph=create_graph))

    def nearest_tokens(self, embeds: torch.Tensor) -> torch.Tensor:
        """The vocabulary token whose embedding is nearest by cosine, at every position."""
        return self.candidates[(F.normalize(embeds.detach(), dim=-1) @ self.unit_vocabulary.T).argmax(dim=-1)]

    def next_token_labels(self, tokens: torch.Tensor) -> torch.Tensor:
        """Labels a client with these tokens would train on: each position's next token, and at
        the last position (whose next token lies outside the window) the model's prediction."""
        with torch.no_grad():
            last = self.candidates[self.model(tokens)[:, -1, self.candidates].argmax(dim=-1)]
        return torch.cat([tokens[:, 1:], last[:, None]], dim=1)

    def random_embeddings(self, shape: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
        """A start drawn like the embedding table: N(0, σ²) with its per-entry σ."""
        sigma = float(self.vocabulary.std())
        return (torch.randn(*shape, self.vocabulary.shape[1], generator=generator) * sigma).to(self.vocabulary)


def l2_l1_distance(grads: list[torch.Tensor], target: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """TAG's distance Σ ‖g − g*‖₂² + α‖g − g*‖₁ over the matched parameters."""
    total = grads[0].new_zeros(())
    for g, t in zip(grads, target):
        diff = g - t
        total = total + diff.pow(2).sum() + alpha * diff.abs().sum()
    return total


class MatchingTrace:
    """The matching distance every few steps (with the step and the seconds since the start),
    reported to the progress bar at every step, and the reconstruction it ends in."""

    def __init__(self, iterations: int, ctx: AttackContext):
        self.iterations, self.ctx = iterations, ctx  # the current rung's budget (`rungs` doubles it)
        self.every = max(1, iterations // TRACE_POINTS)
        self.started = time.perf_counter()
        self.distance = float("nan")
        self.trace: list[float] = []
        self.trace_iterations: list[int] = []
        self.trace_seconds: list[float] = []

    def step(self, step: int, distance: float) -> None:
        self.distance = distance
        if self.ctx.progress is not None:
            self.ctx.progress(step + 1, self.iterations, distance)
        if step % self.every == 0 or step == self.iterations - 1:
            self.trace.append(distance)
            self.trace_iterations.append(step + 1)
            self.trace_seconds.append(round(time.perf_counter() - self.started, 3))

    def rungs(self) -> Iterator[range]:
        """The new steps of each rung of the budget ladder: the first budget's, then, after each
        `reconstruction`, those of the same run continued to twice the steps."""
        done = 0
        while True:
            yield range(done, self.iterations)
            done, self.iterations = self.iterations, 2 * self.iterations

    def reconstruction(self, tokens: torch.Tensor) -> Reconstruction:
        return Reconstruction(inputs=tokens.cpu(), labels=None, iterations=self.iterations,
                              final_distance=self.distance, trace=list(self.trace),
                              trace_iterations=list(self.trace_iterations), trace_seconds=list(self.trace_seconds))


@dataclass(frozen=True)
class TagOptions:
    # about 0.3 s per step for batch 4 × 16 on the default gpt2 on one core (the LM head's
    # 50257 logits dominate): 1000 steps take about five minutes; at 200, ROUGE-2 at batch 4
    # was about half of what 1000 reach (docs/text.md)
    iterations: int = field(default=1000, metadata={"range": (1, 1_000_000)})
    lr: float = field(default=0.01, metadata={"range": (0.0, 10.0)})
    alpha: float = field(default=0.01, metadata={"range": (0.0, 1e6)})  # weight of the L1 term (paper: 0.01)
    label_every: int = field(default=25, metadata={"range": (1, 1_000_000)})  # steps between label guesses
    tokens: Literal["gradient", "all"] = "gradient"  # candidates: the batch's tokens (from the gradient), or all
    bag_threshold: float = field(default=0.01, metadata={"range": (0.0, 1.0)})  # of the largest row norm

    def __post_init__(self) -> None:
        check(self.lr > 0, "attack 'tag': lr must be > 0")


class EmbeddingMatchingAttack(Attack):
    """What TAG and LAMP share: a GPT-2 text model, one FedSGD gradient, and candidates that are
    input embeddings. Their budget ladder (`rungs`) continues one run: each rung doubles the
    steps of the last and answers with the nearest tokens there; `reconstruct` is its first."""

    requires = frozenset({"batch_size"})
    modalities = ("text",)
    iterative = True
    # an audit's presets: "quick" about a minute at batch 4 on one core, "thorough" the papers' budget
    budgets = {"quick": {"iterations": 200}, "thorough": {"iterations": 2000}}

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: check_text_model(model, self.name)))

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        return next(iter(self.rungs(obs, ctx)))

    def simulator(self, obs: Observation, ctx: AttackContext) -> EmbeddingGradients:
        """The gradient of candidate embeddings on a copy of the sent model, after the checks."""
        check_text_model(obs.model, self.name)
        check_fedsgd(obs, self.name)
        model = copy.deepcopy(obs.model).to(ctx.device)
        return EmbeddingGradients.for_options(model, obs.update.as_gradient(), ctx.device, self.options)


class TAG(EmbeddingMatchingAttack):
    """TAG: L2 + α·L1 gradient matching on continuous input embeddings, then nearest tokens."""

    name = "tag"
    Options = TagOptions

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        opt = self.options
        progress = MatchingTrace(opt.iterations, ctx)
        sim = self.simulator(obs, ctx)
        shape = (obs.batch_size, int(obs.input_shape[0]))
        embeds = sim.random_embeddings(shape, ctx.generator(23)).requires_grad_(True)
        optimizer = torch.optim.Adam([embeds], lr=opt.lr)
        labels = sim.next_token_labels(sim.nearest_tokens(embeds))
        for steps in progress.rungs():
            for step in steps:
                if step and step % opt.label_every == 0:
                    labels = sim.next_token_labels(sim.nearest_tokens(embeds))
                optimizer.zero_grad(set_to_none=True)
                loss = l2_l1_distance(sim(embeds, labels, create_graph=True), sim.target, opt.alpha)
                loss.backward(inputs=[embeds])
                optimizer.step()
                progress.step(step, float(loss.detach()))
            yield progress.reconstruction(sim.nearest_tokens(embeds))
