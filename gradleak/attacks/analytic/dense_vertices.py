"""Dense-layer vertices: a FedAvg client's examples recovered through the features they fed the
first dense+ReLU layer behind the convolutions, then inverted to pixels (Dimitrov et al.'s
setting, many local steps and an unknown order; docs/client-training.md, "Through the dense
layers' inputs").

The first dense layer's update is ΔW = Gᵀ F: every example's features f (one row of F) lie in the
B-dimensional row space of ΔW, however many local steps the client took and in whatever order,
and a ReLU before the pool leaves each with dozens of exact zeros. So each f is, up to noise, a
vertex of {c : V c ≥ 0} (V the row space): given its zero set, the null vector of those rows of V
recovers it (SPEAR's sparsity argument, Dimitrov et al. NeurIPS 2024, on the layer's input side).

- **Search.** From start features (held-out examples when `prior_data` is granted, else pen
  strokes and photograph crops, `gradleak.data.auxiliary`), alternate "the `zeros` smallest live
  coordinates are zero" with the null vector of those rows, `rounds` times, once per zero count.
  Synthetic starts rarely lie near an example's vertex, so the first `refined` of them are also
  moved in pixel space toward the vertex their features reach, `refine_rounds` times
  (`pixel_search`), and searched again from where they end.
- **Trust**, needing no ground truth: how many starts reach a vertex (within cosine 0.99), its
  negative mass before clamping, σ_min/σ_2 of its last solve, and, for the `realizable` most
  trusted distinct vertices, how closely the convolutions can produce it from pixels.
- **Selection.** The B most trusted vertices, none within cosine `merge` of another, raised to
  halfway between the trusted vertices' typical cosine and 1 where that is higher (slots left
  empty once that rule excludes every vertex are filled from distinct ones). Each is scaled by the
  bias update (f · ΔW⁺ · Δb = 1 for a true example) and labelled by an assignment under the
  recovered label counts: under its own label c a true example satisfies f · ΔW⁺ · g(f, c) = 1,
  g its error signal replayed along the update.
- **Images** whose features are the selected vertices: Adam through the known convolutions, with
  a TV prior (`gradleak.solvers.features`, sigmoid pixels).

Defaults were chosen on MNIST, ReLU LeNet-5, 50 images, 10 epochs × 10 mini-batches of 5, seeds
100–101 (`python -m benchmarks fedavg_features`); `zeros` assumes about 70 zeros per example
among the live coordinates (LeNet-5 on MNIST: median 68) and is the option to set for another
model (`extras["start_zeros_median"]` reports the starts' own count). Each count is clipped to
what a vertex can have: at least B − 1, and fewer than the live coordinates.

Over 400 lines: one attack, whose steps (starts, vertex search, trust, labels, inversion)
share the layer's factorisation and are read together.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn
from torch.func import functional_call

from ...errors import GradleakError
from ...fl.training import TrainingSpec
from ...options import check
from ...solvers.features import FeatureExtractor, FeatureInversionOptions, invert_features
from ...threat import Observation
from ..base import Attack, AttackContext, Reconstruction, check_result
from ..replay.labels import recover_labels
from .spear import DenseReLU, locate_dense_relu

SAME = 0.995  # vertices this close (cosine) are one vertex
LIKENESS = 1500  # the most trusted distinct vertices whose typical likeness sets the merge (merge_for)
HITS = 0.99  # starts whose vertices fall this close to one another reach "the same" vertex
START_CHUNK = 10000  # start examples through the convolutions at a time (memory)
REFINE_CHUNK = 1000  # refined starts at a time (memory: their activations keep gradients)
# logit levels the feature inversions start from (mid-gray, dark, bright), the best kept per image:
# a gray start alone stalls where the first layer is dead on a gray background (solvers/features.py)
INVERSION_STARTS = (0.0, -3.0, 3.0)
RESIDUAL_STARTS = (0.0, -3.0)  # the realizable check's inversions: gray and dark (each start a full run)


@dataclass
class DenseVerticesOptions:
    starts: int = field(default=10000, metadata={"range": (100, 100_000)})  # start features at the first rung
    zeros: str = "65,80"  # coordinates assumed zero per solve; several: a search per count, pooled
    rounds: int = 15  # alternations of zero set and null vector per start
    # synthetic starts (no prior_data) also moved in pixels toward their vertex (0: off)
    refined: int = field(default=2000, metadata={"range": (0, 100_000)})
    refine_rounds: int = field(default=10, metadata={"range": (1, 1000)})  # vertex targets per refined start
    refine_steps: int = field(default=20, metadata={"range": (1, 1000)})  # Adam steps toward each target
    refine_lr: float = 0.1
    realizable: int = field(default=1500, metadata={"range": (0, 100_000)})  # vertices checked against pixels (0: off)
    realizable_steps: int = 600  # Adam steps of that check (no prior)
    # weight of the log residual in the trust, and a vertex within cosine `merge` of a chosen one
    # is the same example (raised where the trusted vertices are alike: merge_for); both chosen on
    # tuning seeds 30, 31, 100 and 101 (docs/client-training.md)
    realizable_weight: float = 8.0
    merge: float = 0.98
    layer: str = ""  # the dense layer (module name); "" = the first one followed by ReLU
    feature_steps: int = 1000  # Adam steps inverting the chosen features to pixels
    feature_lr: float = 0.05
    # chosen on tuning seeds 30, 31, 100 and 101 (docs/client-training.md)
    feature_tv: float = 0.05

    def __post_init__(self):
        check(self.starts >= 1, "attack 'dense-vertices': starts must be >= 1")
        counts = self.zero_counts()
        check(bool(counts) and min(counts) >= 1, "attack 'dense-vertices': zeros must be positive integers, "
              "comma-separated (e.g. 65,80)")
        check(self.rounds >= 1, "attack 'dense-vertices': rounds must be >= 1")
        check(self.refined >= 0, "attack 'dense-vertices': refined must be >= 0")
        check(self.refine_lr > 0, "attack 'dense-vertices': refine_lr must be > 0")
        check(self.realizable >= 0, "attack 'dense-vertices': realizable must be >= 0")
        check(self.realizable_steps >= 1, "attack 'dense-vertices': realizable_steps must be >= 1")
        check(0 < self.merge < 1, "attack 'dense-vertices': merge must be in (0, 1)")
        check(self.feature_steps >= 1, "attack 'dense-vertices': feature_steps must be >= 1")
        self.inversion()

    def inversion(self) -> FeatureInversionOptions:
        return FeatureInversionOptions(self.feature_steps, self.feature_lr, self.feature_tv, "sigmoid",
                                       starts=INVERSION_STARTS)

    def zero_counts(self) -> list[int]:
        try:
            return [int(z) for z in str(self.zeros).replace(";", ",").split(",") if z.strip()]
        except ValueError:
            return []


@dataclass(frozen=True)
class RowSpace:
    """The first dense layer's update, factored: its B-dimensional row space (`basis`, F × B),
    the pseudo-inverse ΔW⁺ restricted to it, and the live input coordinates."""

    basis: torch.Tensor
    pinv: torch.Tensor
    live: torch.Tensor
    bias: torch.Tensor


def row_space(weight_update: torch.Tensor, bias_update: torch.Tensor, batch: int) -> RowSpace:
    u, s, vh = torch.linalg.svd(weight_update, full_matrices=False)
    basis = vh[:batch].T
    pinv = basis @ torch.diag(1 / s[:batch]) @ u[:, :batch].T
    live = weight_update.norm(dim=0) > 1e-12 * weight_update.norm()
    return RowSpace(basis, pinv, live, bias_update)


def vertices(start_features: torch.Tensor, space: RowSpace, zeros: int, rounds: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Null-vector vertices of {c : basis·c ≥ 0} reached from `start_features`: the vertices
    clamped at 0, the negative share each had before clamping, and σ_min/σ_2 of the last solve
    (small: the assumed zeros fit one direction well)."""
    basis = space.basis
    feats = start_features @ basis @ basis.T
    cols = space.live.nonzero().flatten()
    sv = torch.ones(len(feats), 2)
    for _ in range(rounds):
        scores = (feats / feats.abs().amax(1, keepdim=True))[:, cols]
        rows = cols[scores.argsort(dim=1)[:, :zeros]]
        _, sv, vh = torch.linalg.svd(basis[rows])
        feats = torch.einsum("kr,nr->nk", basis, vh[:, -1])
        feats = feats * torch.sign(feats.sum(1, keepdim=True))
    negative = feats.clamp(max=0).norm(dim=1) / feats.norm(dim=1)
    return feats.clamp(min=0), negative, sv[:, -1] / sv[:, -2]


def pixel_search(extract: FeatureExtractor, images: torch.Tensor, space: RowSpace, zeros: int, rounds: int,
                 steps: int, lr: float) -> torch.Tensor:
    """Start images moved until their features sit at vertices: in each of `rounds`, the vertex
    nearest the current features (5 alternations), then `steps` Adam steps on the pixels (sigmoid)
    pulling the features' direction toward it. A synthetic start rarely lies near an example's
    vertex; moving its pixels keeps it something the convolutions produce, and example vertices
    are such points where most other vertices are not."""
    logits = torch.logit(images.clamp(0.02, 0.98)).requires_grad_(True)
    optimizer = torch.optim.Adam([logits], lr=lr)
    for _ in range(rounds):
        with torch.no_grad():
            target = nn.functional.normalize(vertices(extract(torch.sigmoid(logits)), space, zeros, 5)[0], dim=1)
        for _ in range(steps):
            optimizer.zero_grad()
            with torch.enable_grad():
                moved = nn.functional.normalize(extract(torch.sigmoid(logits)), dim=1)
                (moved - target).pow(2).sum().backward()
            optimizer.step()
    return torch.sigmoid(logits).detach()


def distinct(unit: torch.Tensor, order: torch.Tensor, limit: int, same: float = SAME,
             taken: torch.Tensor | None = None) -> torch.Tensor:
    """`taken`, then the first vertices of `order` that are not within cosine `same` of one kept
    earlier, up to `limit` in all."""
    kept: list[int] = [] if taken is None else taken.tolist()
    ordered = unit[order]
    free = torch.ones(len(order), dtype=torch.bool)
    if kept:
        free &= (ordered @ unit[kept].T).amax(1) <= same
    for a in range(len(order)):
        if len(kept) >= limit:
            break
        if not free[a]:
            continue
        kept.append(int(order[a]))
        free[a + 1:] &= ordered[a + 1:] @ ordered[a] <= same
    return torch.tensor(kept, dtype=torch.long)


def select(found: torch.Tensor, ratio: torch.Tensor, negative: torch.Tensor, labels: torch.Tensor,
           space: RowSpace, signals_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
           merge: float, pool: int, weight: float,
           residual_of: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, float]:
    """The slots' features (one row per recovered label, in the order of `labels`) and the merge
    the choice used (`merge_for`, at least `merge`; reported as `extras["merge"]`): the most
    trusted distinct vertices, each scaled by the bias update and given a label by an assignment
    under the recovered counts (see the module's docstring). With `residual_of`, the `pool` most
    trusted distinct vertices are ranked again by their residual through the convolutions."""
    unit = nn.functional.normalize(found, dim=1)
    hits = torch.cat([(unit[i:i + 512] @ unit.T > HITS).sum(1) for i in range(0, len(unit), 512)])
    trust = negative.clamp(min=1e-12).log() - hits.float().log() + ratio.clamp(min=1e-12).log()
    scales = 1 / (unit @ space.pinv @ space.bias)
    if residual_of is not None and pool > 0:
        order = trust.argsort()
        kept = distinct(unit, order[scales[order] > 0], pool)
        unit, scales = unit[kept], scales[kept]
        trust = trust[kept] + weight * residual_of(unit * scales[:, None]).clamp(min=1e-12).log()
    order = trust.argsort()
    order = order[scales[order] > 0]
    merge = merge_for(unit[distinct(unit, order, LIKENESS)], merge)
    picked = distinct(unit, order, len(labels), merge)
    # slots still empty once `merge` has excluded every vertex left: filled from distinct ones
    picked = distinct(unit, order, len(labels), taken=picked)
    if len(picked) < len(labels):
        raise GradleakError(f"attack 'dense-vertices': {len(picked)} distinct vertices for {len(labels)} examples "
                            "(raise starts, or lower zeros)")
    feats = unit[picked] * scales[picked, None]
    classes = labels.unique().tolist()
    fit = torch.stack([((feats @ space.pinv) * signals_of(feats, torch.full((len(feats),), c))).sum(1)
                       for c in classes], 1)
    cost = (fit - 1).abs()[:, [classes.index(int(c)) for c in labels]]
    rows, slots = linear_sum_assignment(cost.numpy())
    out = torch.zeros(len(labels), found.shape[1])
    out[torch.as_tensor(slots)] = feats[torch.as_tensor(rows)]
    return out, merge


def merge_for(unit: torch.Tensor, floor: float) -> float:
    """The cosine above which a vertex counts as one already chosen: halfway from how alike the
    trusted vertices typically are (their median pairwise cosine) to identical, and at least
    `floor`. Where a model's features make the examples alike, distinct examples' vertices lie
    closer together than `floor`, and a fixed threshold would keep all but one of them out."""
    if len(unit) < 2:
        return floor
    cos = unit @ unit.T
    alike = cos[torch.triu(torch.ones_like(cos, dtype=torch.bool), diagonal=1)].median()
    return max(floor, float(1 + alike) / 2)


@dataclass(frozen=True)
class Found:
    """One rung's result: the chosen features (one row per slot), their labels, every vertex
    reached so far, and the images inverted from the chosen features."""

    features: torch.Tensor
    labels: torch.Tensor
    pooled: torch.Tensor
    images: torch.Tensor
    extras: dict


class ErrorSignals:
    """Per-example error signals at the dense layer's output, summed over the client's passes,
    with the weights interpolated along the observed update (the batch's own trajectory is
    unknown): g(f, c) for features f under label c, as plain SGD accumulates them."""

    def __init__(self, obs: Observation, layer: DenseReLU):
        self.model = copy.deepcopy(obs.model)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.layer = self.model.get_submodule(layer.name)
        self.params = {n: p.detach() for n, p in self.model.named_parameters()}
        delta = obs.update.tensors
        self.delta = {n: delta[n].to(p.dtype) if n in delta else torch.zeros_like(p) for n, p in self.params.items()}
        training, batch = obs.training, obs.batch_size
        step_batch = training.step_batch_size(batch)
        self.passes = training.local_epochs or max(1, round(training.num_steps(batch) * step_batch / batch))
        self.pass_step = training.lr * batch / step_batch
        self.input_shape = tuple(obs.input_shape)

    def __call__(self, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        captured: dict[str, torch.Tensor] = {}

        given = feats.detach().requires_grad_(True)  # so the layer's output carries a gradient

        def substitute(_module, _inputs):
            return (given,)

        def keep(_module, _inputs, output):
            captured["z"] = output

        hooks = [self.layer.register_forward_pre_hook(substitute), self.layer.register_forward_hook(keep)]
        total = torch.zeros(len(feats), self.layer.out_features)
        try:
            dummy = torch.zeros(len(feats), *self.input_shape)
            for e in range(self.passes):
                params = {n: p - (e / self.passes) * self.delta[n] for n, p in self.params.items()}
                with torch.enable_grad():
                    logits = functional_call(self.model, params, (dummy,))
                    loss = nn.functional.cross_entropy(logits, labels)
                    (signal,) = torch.autograd.grad(loss, captured["z"])
                total = total + self.pass_step * signal
        finally:
            for hook in hooks:
                hook.remove()
        return total


def residuals(extract: FeatureExtractor, feats: torch.Tensor, input_shape: tuple[int, ...], steps: int,
              generator_of: Callable[[], torch.Generator], chunk: int = 500) -> torch.Tensor:
    """How far the convolutions are from producing `feats`: the relative squared error left after
    inverting each to pixels without a prior."""
    options = FeatureInversionOptions(steps, 0.05, 0.0, "sigmoid", starts=RESIDUAL_STARTS)
    out = []
    for a in range(0, len(feats), chunk):
        part = feats[a:a + chunk]
        with torch.enable_grad():
            images = invert_features(extract, part, input_shape, options, generator=generator_of())
        with torch.no_grad():
            out.append((extract(images) - part).pow(2).sum(1) / (part.pow(2).sum(1) + 1e-12))
    return torch.cat(out)


class DenseVertices(Attack):
    """The examples of a multi-step update, through the vertices of its first dense layer's row space."""

    name = "dense-vertices"
    Options = DenseVerticesOptions
    requires = frozenset({"batch_size", "local_training"})
    uses = frozenset({"prior_data", "labels"})
    modalities = ("image",)
    iterative = True  # more starts can reach more vertices
    budgets = {"quick": {"starts": 2000, "refined": 500, "realizable": 300, "realizable_steps": 300,
                         "feature_steps": 500},
               "thorough": {"starts": 20000, "refined": 4000, "realizable": 3000}}

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: self._layer(model, input_shape)))

    def _layer(self, model: nn.Module, input_shape: tuple[int, ...]) -> DenseReLU:
        layer = locate_dense_relu(model, input_shape, self.options.layer, self.name)
        if layer.on_input:
            raise GradleakError("attack 'dense-vertices' inverts a dense layer behind convolutions; this one sees "
                                "the input (spear and fedavg attack that)")
        return layer

    def budget(self) -> int | None:
        return int(self.options.starts)

    def blind_to(self, training: TrainingSpec) -> str | None:
        if not training.plain_sgd:
            return "assigns labels as plain SGD accumulates error signals (the features do not depend on it)"
        return None

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        return next(iter(self.rungs(obs, ctx)))

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        for found in self.search(obs, ctx):
            yield Reconstruction(inputs=found.images, labels=found.labels, iterations=found.extras["starts"],
                                 extras=found.extras)

    def search(self, obs: Observation, ctx: AttackContext) -> Iterator[Found]:
        """`starts` start features at the first rung, twice as many at each next one; the
        vertices found so far are kept, the selection and the images made afresh."""
        opt = self.options
        started = time.perf_counter()
        layer = self._layer(obs.model, tuple(obs.input_shape))
        batch = obs.batch_size
        grads = obs.update.tensors
        weight, bias = grads.get(f"{layer.name}.weight"), grads.get(f"{layer.name}.bias")
        if weight is None or bias is None:
            raise GradleakError(f"attack 'dense-vertices': the update has no tensors for layer '{layer.name}'")
        if batch > min(weight.shape):
            raise GradleakError(f"attack 'dense-vertices': layer '{layer.name}' has {min(weight.shape)} units or "
                                f"inputs, too few to separate {batch} examples")
        space = row_space(weight.float(), bias.float(), batch)
        live = int(space.live.sum())
        if live < batch + 1:
            raise GradleakError(f"attack 'dense-vertices': layer '{layer.name}' has {live} inputs that saw the "
                                f"batch, too few for {batch} examples")
        # a vertex needs at least batch − 1 zeros to be determined, and one coordinate left nonzero
        counts = sorted({min(max(z, batch - 1), live - 2) for z in opt.zero_counts()})
        labels = recover_labels(obs, "auto", ctx.generator(17)).sort().values
        extract = FeatureExtractor(obs.model, layer.name)
        signals = ErrorSignals(obs, layer)
        source = StartSource(obs, ctx)
        found: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        target, used = opt.starts, 0
        refined = 0
        while True:
            # the rung's share of refined starts: the first of its new starts
            quota = min(opt.refined, opt.starts) * target // opt.starts - refined if source.refine else 0
            for a in range(used, target, START_CHUNK):
                start_images = source.take(a, min(START_CHUNK, target - a))
                with torch.no_grad():
                    starts = extract(start_images)
                    found += [vertices(starts, space, z, opt.rounds) for z in counts]
                share = max(0, min(len(start_images), quota))
                quota -= share
                for b in range(0, share, REFINE_CHUNK):
                    moved = pixel_search(extract, start_images[b:min(b + REFINE_CHUNK, share)], space, max(counts),
                                         opt.refine_rounds, opt.refine_steps, opt.refine_lr)
                    with torch.no_grad():
                        found += [vertices(extract(moved), space, z, opt.rounds) for z in counts]
                    refined += len(moved)
            used = target
            pooled, negative, ratio = (torch.cat(parts) for parts in zip(*found))
            residual_of = None
            if opt.realizable:
                def residual_of(f: torch.Tensor) -> torch.Tensor:
                    return residuals(extract, f, tuple(obs.input_shape), opt.realizable_steps,
                                     lambda: ctx.generator(41))
            chosen, merge = select(pooled, ratio, negative, labels, space, signals, merge=opt.merge,
                                   residual_of=residual_of, pool=opt.realizable, weight=opt.realizable_weight)
            with torch.enable_grad():
                images = invert_features(extract, chosen, tuple(obs.input_shape), opt.inversion(),
                                         generator=ctx.generator(43))
            extras = {"layer": layer.name, "starts": used, "zeros": counts, "start_source": source.name,
                      "refined": refined, "vertices": len(pooled), "live": live, "merge": round(merge, 4),
                      "start_zeros_median": float((starts[:, space.live] <= 0).sum(1).float().median()),
                      "seconds": round(time.perf_counter() - started, 3)}
            yield Found(chosen, labels, pooled, images, extras)
            target *= 2


class StartSource:
    """Where the vertex search starts: held-out examples when the threat model grants them, in
    their order (the first `starts`), else synthetic images, pen strokes and photograph crops
    alternately (`gradleak.data.auxiliary`), which the search also moves in pixels (`refine`)."""

    def __init__(self, obs: Observation, ctx: AttackContext):
        self.shape = tuple(obs.input_shape)
        self.prior: torch.Tensor | None = None
        if obs.knows("prior_data"):
            prior = obs.get("prior_data")
            if tuple(prior.input_shape) != self.shape:
                raise GradleakError(f"attack 'dense-vertices': held-out data of shape {tuple(prior.input_shape)} "
                                    f"for a model of input shape {self.shape}")
            self.prior = prior.inputs.float()
        self.generator = ctx.generator(37)
        self.name = "prior_data" if self.prior is not None else "strokes-and-photos"
        self.refine = self.prior is None  # held-out examples start near the examples' vertices already

    def take(self, start: int, count: int) -> torch.Tensor:
        """`count` starts from the `start`-th on: held-out examples while they last, then
        synthetic images continue the search."""
        held = self.prior[start:start + count] if self.prior is not None else torch.empty(0, *self.shape)
        if len(held) == count:
            return held
        return torch.cat([held, self._synthetic(count - len(held))])

    def _synthetic(self, count: int) -> torch.Tensor:
        from ...data.auxiliary import pen_strokes, public_images

        out = torch.empty(count, *self.shape)
        out[0::2] = pen_strokes(self.shape, len(out[0::2]), self.generator)
        out[1::2] = public_images(self.shape, len(out[1::2]), self.generator)
        return out
