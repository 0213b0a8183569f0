"""FedAvg utility of a defense: the model quality the defense costs.

Clients hold Dirichlet(α) non-IID shards of the training split (Hsu et al.
2019, as in Yue et al. §5); every round `per_round` of them are drawn, each runs
`gradleak.fl.compute_update` with the defense chain — the very code path attack
runs use — and the server averages the updates (sample-weighted). Reports the
final training loss (Liu et al. Tab. 5), test accuracy (Yue et al. Fig. 9) and,
for DP defenses, ε from Opacus's RDP accountant. Deterministic given the seed.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .data import Dataset
from .data.references import dataset_spec
from .defenses import make_chain
from .errors import GradleakError
from .fl import TrainingSpec, aggregate_updates, compute_update
from .fl.local import batch_loss
from .fl.training import check_bn_mode
from .models import ModelSpec, build_model
from .options import ComponentSpec, parse_chain, parse_spec
from .rero import RDP_ORDERS
from .seeding import stream

DEFAULT_MODEL = "lenet:activation=relu,init=default"

# A model whose test accuracy is within this of chance (1/classes) did not train: every defense
# then "costs" nothing, which says nothing about the defense. The analysis applies the same
# margin (gradleak.analysis.NEAR_CHANCE, kept there too so the analysis need not import torch).
NEAR_CHANCE = 0.1


# logits evaluated per forward pass (128 MB of float32): a language model's vocabulary at every
# position would otherwise take gigabytes per pass
LOGITS_PER_PASS = 1 << 25


# A language model (a label at every position) that trained predicts the next token better than
# a uniform guess over its vocabulary: its test loss lies at least this many nats under
# log(vocabulary). Its accuracy is no guide: one that learned the most frequent tokens scores
# about 5% on news, under 1/vocabulary + NEAR_CHANCE. The analysis keeps the same margin.
NEAR_UNIFORM_NATS = 1.0


def near_chance(accuracy: float, num_classes: int) -> bool:
    """True when `accuracy` is not clearly above chance: at most 1/num_classes + NEAR_CHANCE."""
    return accuracy <= 1.0 / num_classes + NEAR_CHANCE


def near_uniform(loss: float, vocabulary: int) -> bool:
    """True when a language model's test `loss` is not clearly under a uniform guess's:
    above log(vocabulary) − NEAR_UNIFORM_NATS."""
    return not loss <= math.log(vocabulary) - NEAR_UNIFORM_NATS


@dataclass(frozen=True)
class UtilitySpec:
    dataset: str = "mnist"
    model: str = DEFAULT_MODEL
    defenses: tuple[str, ...] = ()
    clients: int = 100
    per_round: int = 10
    rounds: int = 20
    dirichlet: float = 0.5
    local_steps: int | None = None  # if set: this many local SGD steps instead of local epochs
    local_epochs: int = 1
    local_batch_size: int = 32
    bn_mode: str = "train"  # batch norm during local training, as in attack runs
    lr: float = 0.1  # trains the default federation well (docs/defenses.md)
    seed: int = 0
    delta: float = 1e-5  # δ of the reported (ε, δ)

    def __post_init__(self):
        def require(ok: bool, message: str):
            if not ok:
                raise GradleakError(message)

        require(self.clients >= 1, f"--clients must be >= 1, got {self.clients}")
        require(1 <= self.per_round <= self.clients,
                f"--per-round must be in [1, --clients={self.clients}], got {self.per_round}")
        require(self.rounds >= 1, f"--rounds must be >= 1, got {self.rounds}")
        require(self.dirichlet > 0 and math.isfinite(self.dirichlet),
                f"--dirichlet must be a positive number, got {self.dirichlet}")
        require(self.local_steps is None or self.local_steps >= 1,
                f"--local-steps must be >= 1, got {self.local_steps}")
        require(self.local_epochs >= 1, f"--local-epochs must be >= 1, got {self.local_epochs}")
        require(self.local_steps is None or self.local_epochs == 1,
                f"--local-steps {self.local_steps} and --local-epochs {self.local_epochs}: a client trains a "
                "number of steps or of passes over its data; give one")
        require(self.local_batch_size >= 1, f"--local-batch-size must be >= 1, got {self.local_batch_size}")
        require(0 < self.delta < 1, f"--delta must be in (0, 1), got {self.delta}")
        check_bn_mode(self.bn_mode)

    # The model and the defense chain parsed once per spec (the texts stay the store's keys).
    @cached_property
    def model_spec(self) -> ComponentSpec:
        return parse_spec(self.model, "model")

    @cached_property
    def defense_specs(self) -> tuple[ComponentSpec, ...]:
        return parse_chain(self.defenses)

    def training(self) -> TrainingSpec:
        schedule = ({"local_steps": self.local_steps} if self.local_steps is not None
                    else {"local_epochs": self.local_epochs})
        return TrainingSpec(lr=self.lr, local_batch_size=self.local_batch_size, batchnorm=self.bn_mode, **schedule)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class UtilityResult:
    spec: UtilitySpec
    train_loss: float  # global model's mean loss over all clients' training data
    test_accuracy: float
    test_loss: float
    epsilon: float | None  # worst client's ε at spec.delta (DP defenses only)
    seconds: float
    history: list[dict] = field(default_factory=list)  # per round: mean client loss before the round
    # lets the analysis tell a model that did not train (accuracy near 1/classes, or a language
    # model's loss near a uniform guess's) from a cheap defense
    num_classes: int | None = None
    next_token: bool = False  # a label at every position: a language model's next tokens
    modality: str | None = None  # the trained-on data's, as its loader declared it (for the store)
    # DP defenses only: the Rényi DP curve (order, ε) that bounds every client's training, the
    # pointwise worst over clients; the analysis reads the reconstruction-robustness bound off it
    rdp: list[tuple[float, float]] | None = None

    def to_json(self) -> dict:
        return {"defenses": list(self.spec.defenses), "dataset": self.spec.dataset, "model": self.spec.model,
                "rounds": self.spec.rounds, "train_loss": self.train_loss, "test_accuracy": self.test_accuracy,
                "test_loss": self.test_loss, "num_classes": self.num_classes, "next_token": self.next_token,
                **self._privacy(),
                "seconds": self.seconds, "history": self.history,
                "spec": self.spec.to_dict()}

    def _privacy(self) -> dict:
        # An unbounded ε (a DP defense without noise) is no guarantee: null plus a flag, never Infinity.
        if self.epsilon is None:
            return {"epsilon": None, "delta": None}
        if not math.isfinite(self.epsilon):
            return {"epsilon": None, "delta": self.spec.delta, "dp_guarantee": False}
        return {"epsilon": self.epsilon, "delta": self.spec.delta,
                **({"rdp": [list(point) for point in self.rdp]} if self.rdp else {})}


def dirichlet_partition(labels: torch.Tensor, clients: int, alpha: float, seed: int) -> list[torch.Tensor]:
    """Client q_m ~ Dir(α·1_c); class k's examples go to clients in proportion to q_{m,k}.
    Examples without one class (a language model's next token at every position) are split
    among the clients uniformly at random instead."""
    rng = np.random.default_rng(seed)
    if labels.dim() != 1:
        return [torch.tensor(part, dtype=torch.long) for part in np.array_split(rng.permutation(len(labels)), clients)]
    y = labels.numpy()
    classes = np.unique(y)
    q = rng.dirichlet(np.full(len(classes), alpha), size=clients)  # (clients, classes)
    shards: list[list[int]] = [[] for _ in range(clients)]
    for column, k in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(y == k))
        share = q[:, column] / q[:, column].sum()
        cuts = (np.cumsum(share)[:-1] * len(idx)).astype(int)
        for client, part in enumerate(np.split(idx, cuts)):
            shards[client].extend(part.tolist())
    return [torch.tensor(sorted(s, key=lambda _: rng.random()), dtype=torch.long) for s in shards]


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, batch: int = 2000) -> tuple[float, float]:
    """(mean loss, accuracy) of `model` on `data`; for a language model (a label at every
    position) the accuracy is the next-token accuracy over all positions."""
    model.eval()
    loss, correct = 0.0, 0
    per_example = data.labels[0].numel() * data.num_classes  # logits one example produces
    batch = max(1, min(batch, LOGITS_PER_PASS // per_example))
    for start in range(0, len(data), batch):
        x, y = data.inputs[start:start + batch], data.labels[start:start + batch]
        logits = model(x)
        loss += float(batch_loss(logits, y)) * len(y)
        correct += int((logits.argmax(-1) == y).sum())
    model.train()
    return loss / len(data), correct / data.labels.numel()


def utility_setup(spec: UtilitySpec, load: Callable[[Any], Dataset] | None = None):
    """What a utility run builds before it trains — (defense chain, training, train split,
    test split, model) — and so every check it makes before any work (`gradleak sweep` runs
    it on each utility spec before the first cell, with `load` reusing loaded datasets)."""
    from .data import load_dataset

    load = load or load_dataset
    chain = make_chain(spec.defense_specs)
    training = spec.training()
    train = load(dataset_spec(spec.dataset, "train", None))
    test = load(dataset_spec(spec.dataset, "test", None))
    if train.samples_only or len(train) < spec.clients:
        raise GradleakError(f"dataset '{train.name}' is too small for {spec.clients} FedAvg clients")
    model_spec = spec.model_spec
    options = dict(model_spec.options)
    activation = options.pop("activation", None)
    model = build_model(ModelSpec(model_spec.name, train.input_shape, train.num_classes, activation=activation,
                                  seed=spec.seed, options=options))
    return chain, training, train, test, chain.transform_model(model)


def run_utility(spec: UtilitySpec, progress: Callable[[int, int, dict], None] | None = None) -> UtilityResult:
    """Train FedAvg under the spec's defenses; deterministic given `spec.seed`."""
    start = time.perf_counter()
    torch.manual_seed(spec.seed)  # for any module drawing from the global RNG
    chain, training, train, test, model = utility_setup(spec)
    model.train()

    shards = dirichlet_partition(train.labels, spec.clients, spec.dirichlet, spec.seed)
    # A tiny α can leave a client empty; give it one example so every client can train.
    shards = [s if len(s) else torch.tensor([i]) for i, s in enumerate(shards)]
    client_state: dict[int, dict] = {}
    dp_steps = [0] * spec.clients
    sampler = stream(spec.seed, "utility", "client-sampling")
    history = []
    for rnd in range(spec.rounds):
        chosen = torch.randperm(spec.clients, generator=sampler)[:spec.per_round].tolist()
        updates = []
        for client in chosen:
            idx = shards[client]
            generator = stream(spec.seed, "utility", "client", rnd, client)
            updates.append(compute_update(model, train.inputs[idx], train.labels[idx], training, chain,
                                          generator, client_state.setdefault(client, {}), train.modality))
            dp_steps[client] += training.num_steps(len(idx))
        aggregate = aggregate_updates(updates)
        scale = aggregate.lr if aggregate.kind == "gradient" else 1.0
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in aggregate.tensors:
                    param -= scale * aggregate.tensors[name].to(param)
        norm = aggregate.norm()
        if not math.isfinite(norm):
            raise GradleakError(f"training diverged in round {rnd + 1} (lower --lr?)")
        history.append({"round": rnd + 1, "update_norm": norm})
        if progress is not None:
            progress(rnd + 1, spec.rounds, history[-1])

    train_loss, _ = evaluate(model, train)
    test_loss, test_accuracy = evaluate(model, test)
    epsilon = _epsilon(chain, shards, dp_steps, training, spec.delta)
    rdp = _rdp(chain, shards, dp_steps, training) if epsilon is not None else None
    return UtilityResult(spec, train_loss, test_accuracy, test_loss, epsilon, time.perf_counter() - start, history,
                         num_classes=train.num_classes, next_token=train.labels.dim() > 1, modality=train.modality,
                         rdp=rdp)


def _epsilon(chain, shards, dp_steps, training: TrainingSpec, delta: float) -> float | None:
    """Worst client's ε over the defenses that account privacy (composed by adding ε)."""
    worst = None
    for client, steps in enumerate(dp_steps):
        if not steps:
            continue
        rate = training.step_batch_size(len(shards[client])) / len(shards[client])
        spent = [d.privacy(sample_rate=rate, steps=steps, delta=delta) for d in chain]
        spent = [e for e in spent if e is not None]
        if spent:
            worst = max(worst or 0.0, sum(spent))
    return worst



def _rdp(chain, shards, dp_steps, training: TrainingSpec) -> list[tuple[float, float]] | None:
    """The worst client's Rényi DP curve over the defenses that account privacy (composed by
    adding ε at each order), pointwise over clients: a curve that bounds every client's."""
    worst: list[float] | None = None
    for client, steps in enumerate(dp_steps):
        if not steps:
            continue
        rate = training.step_batch_size(len(shards[client])) / len(shards[client])
        curves = [d.rdp(sample_rate=rate, steps=steps, orders=list(RDP_ORDERS)) for d in chain]
        curves = [c for c in curves if c is not None]
        if curves:
            total = [sum(values) for values in zip(*curves)]
            worst = total if worst is None else [max(a, b) for a, b in zip(worst, total)]
    return None if worst is None else list(zip(RDP_ORDERS, worst))
