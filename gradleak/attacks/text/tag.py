"""TAG: gradient attack on transformer-based language models (Deng et al., Findings of EMNLP
2021), for gradleak's GPT-2 (gradleak.models.gpt2) under FedSGD.

The client's tokens are unknown, so TAG optimises continuous input embeddings instead, one
vector per position (B × T × width), fed to the model in place of the token-embedding lookup
(`GPT2.forward_embeddings`). Adam minimises the distance between the gradient they produce
and the observed one, ‖Δ‖₂² + α‖Δ‖₁ summed over parameters (α = 0.01, the paper's); at the
end each position's vector is mapped to the vocabulary token whose embedding is nearest by
cosine. It is a configuration of the optimisation engine (gradleak.attacks.engine): an
`Embeddings` candidate, a `Matching` with this distance, constant-rate Adam, and a `Hook`
that re-guesses the labels.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from ...errors import GradleakError
from ...models.gpt2 import GPT2
from ...options import check
from ...threat import Observation
from ..base import Attack, AttackContext, Reconstruction, check_result
from ..engine.candidates import Embeddings, GuessedLabels, nearest_tokens
from ..engine.engine import Engine, Hook, Optimizer, Outcome, Tensors
from ..engine.objectives import Matching, Prior

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
    """The FedSGD gradient (mean next-token cross-entropy) that input embeddings produce, by
    matched parameter name: the `simulate` of the engine's `Matching` for TAG and LAMP."""

    def __init__(self, model: GPT2, observed: dict[str, torch.Tensor], device: torch.device):
        self.model = model
        self.names = matched_gradients(model, observed)
        params = dict(model.named_parameters())
        self.params = [params[n] for n in self.names]
        self.target = {n: observed[n].detach().to(device, torch.float32) for n in self.names}
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

    def __call__(self, embeds: torch.Tensor, labels: torch.Tensor, create_graph: bool = True
                 ) -> dict[str, torch.Tensor]:
        logits = self.model.forward_embeddings(embeds)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return dict(zip(self.names, torch.autograd.grad(loss, self.params, create_graph=create_graph)))

    def nearest_tokens(self, embeds: torch.Tensor) -> torch.Tensor:
        """The candidate token whose embedding is nearest by cosine, at every position."""
        return nearest_tokens(embeds, self.unit_vocabulary, self.candidates)

    def candidate(self, start: torch.Tensor) -> Embeddings:
        """The engine's candidate: embeddings from `start`, mapped to these candidate tokens."""
        return Embeddings(start, self.vocabulary[self.candidates], self.candidates)

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


def l2_l1_distance(simulated: Tensors, target: Tensors, alpha: float) -> torch.Tensor:
    """TAG's distance Σ ‖g − g*‖₂² + α‖g − g*‖₁ over the matched parameters."""
    total = next(iter(target.values())).new_zeros(())
    for name, t in target.items():
        diff = simulated[name] - t
        total = total + diff.pow(2).sum() + alpha * diff.abs().sum()
    return total


@dataclass(frozen=True)
class TagOptions:
    # 1000 steps: at 200, ROUGE-2 at batch 4 was about half of what 1000 reach; the cost
    # per step is in docs/text.md
    iterations: int = field(default=1000, metadata={"range": (1, 1_000_000)})
    lr: float = field(default=0.01, metadata={"range": (0.0, 10.0)})
    alpha: float = field(default=0.01, metadata={"range": (0.0, 1e6)})  # weight of the L1 term (paper: 0.01)
    label_every: int = field(default=25, metadata={"range": (1, 1_000_000)})  # steps between label guesses
    tokens: Literal["gradient", "all"] = "gradient"  # candidates: the batch's tokens (from the gradient), or all
    bag_threshold: float = field(default=0.01, metadata={"range": (0.0, 1.0)})  # of the largest row norm

    def __post_init__(self) -> None:
        check(self.lr > 0, "attack 'tag': lr must be > 0")


class EmbeddingMatchingAttack(Attack):
    """What TAG and LAMP share: a GPT-2 text model, one FedSGD gradient, and the engine
    (gradleak.attacks.engine) configured with an `Embeddings` candidate, labels guessed from its
    nearest tokens every `label_every` steps (a `Hook`) and the attack's `distance` as the
    matching. The budget ladder (`rungs`) continues one engine run: each rung doubles the steps
    of the last and answers with the nearest tokens there; `reconstruct` is its first."""

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

    def distance(self, simulated: Tensors, target: Tensors) -> torch.Tensor:
        """The matching distance: TAG's L2 + α·L1."""
        return l2_l1_distance(simulated, target, self.options.alpha)

    def simulator(self, obs: Observation, ctx: AttackContext) -> EmbeddingGradients:
        """The gradient of candidate embeddings on a copy of the sent model, after the checks."""
        check_text_model(obs.model, self.name)
        check_fedsgd(obs, self.name)
        model = copy.deepcopy(obs.model).to(ctx.device)
        return EmbeddingGradients.for_options(model, obs.update.as_gradient(), ctx.device, self.options)

    def engine(self, sim: EmbeddingGradients, candidate: Embeddings, ctx: AttackContext, *,
               optimizer: Optimizer, priors: Sequence[Prior] = (), hooks: Sequence[Hook] = ()
               ) -> tuple[Engine, GuessedLabels]:
        """The engine run on `candidate`, its labels the next tokens of the candidate's nearest
        tokens, guessed at the start and every `label_every` steps (after the attack's own
        `hooks` at the same step)."""
        labels = GuessedLabels(lambda c: sim.next_token_labels(c.tokens()), candidate)
        engine = Engine(matching=Matching(sim, sim.target, self.distance), labels=labels,
                        candidates=lambda restart: candidate, optimizer=optimizer, priors=priors,
                        hooks=[*hooks, Hook(self.options.label_every, labels.update)],
                        iterations=self.options.iterations,
                        trace_every=max(1, self.options.iterations // TRACE_POINTS), progress=ctx.progress,
                        deadline=ctx.deadline)
        return engine, labels


def text_reconstruction(out: Outcome, tokens: torch.Tensor) -> Reconstruction:
    """The engine's outcome as the reconstruction of `tokens`."""
    return Reconstruction(inputs=tokens.cpu(), labels=None, iterations=out.iterations,
                          final_distance=out.distance, **out.trace_fields())


class TAG(EmbeddingMatchingAttack):
    """TAG: L2 + α·L1 gradient matching on continuous input embeddings, then nearest tokens."""

    name = "tag"
    Options = TagOptions

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        sim = self.simulator(obs, ctx)
        shape = (obs.batch_size, int(obs.input_shape[0]))
        candidate = sim.candidate(sim.random_embeddings(shape, ctx.generator(23)))
        engine, _ = self.engine(sim, candidate, ctx, optimizer=Optimizer("adam", self.options.lr, "constant"))
        for out in engine.start().doublings(self.options.iterations):
            yield text_reconstruction(out, sim.nearest_tokens(out.inputs))
