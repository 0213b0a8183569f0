"""ROG: Reconstruction from Obfuscated Gradients (Yue et al., USENIX Security 2023).

The unknowns are a low-dimensional latent Z per image — by default the image
bicubic-downsampled ×1/4 (d_z = HW/16 per channel) — decoded by bicubic
up-sampling, `X̂ = dec(Z)`. Z starts as enc(U(0,1) noise) and is optimised with
Adam to minimise the L2 distance ‖Δ′ − Δ̃‖² (Eq. 14) between the update the
client would send for X̂ (FedSGD gradient, or the FedAvg delta with the τ local
steps unrolled by `UpdateSimulator`) and the observed, possibly compressed,
update. The decoded image is finally enhanced by a small U-Net
(`gradleak.postprocess`), which plays the role of the image prior.

`rog-sign` (Yue et al., §4.3 "Reconstruction from signSGD", Eq. 15) matches
tanh(g′) to sign(g); magnitudes are lost, so the image is optimised without a
box constraint, normalised by its maximum absolute value and optionally
histogram-equalised.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from ...options import check
from ...threat import Observation
from ..base import AttackContext, Reconstruction, ResumableAttack
from ..engine.candidates import FixedLabels, Latent
from ..engine.engine import Engine, Optimizer
from ..engine.initialization import InitKind, observed_start
from ..engine.objectives import Matching, TotalVariation
from ..learned.learned import learned_start
from ..replay.head_unroll import make_simulator
from ..replay.labels import recover_labels
from ..replay.matching import UpdateSimulator, update_distance

Tensors = dict[str, torch.Tensor]


@dataclass
class ROGOptions:
    iterations: int = 100  # Yue et al.'s code: T_max = 100
    optimizer: Literal["lbfgs", "adam"] = "lbfgs"
    lr: float = 0.05  # Adam step size (paper), cosine-annealed to lr/10; L-BFGS takes unit steps + line search
    scale: int = 4  # bicubic down-sampling factor of the latent (paper: 4)
    # paper: l2 (Eq. 14); layer-cosine sums 1 − cos per tensor, for quantized targets (docs/rog.md)
    distance: Literal["l2", "cosine", "layer-cosine"] = "l2"
    tv: float = 0.3  # TV on the decoded image, relative to the normalised distance (see docs/rog.md)
    anneal: bool = True  # Adam only: cosine-anneal lr to lr/10 (Yue et al.'s code)
    box: bool = False  # Adam only: clamp the latent to [0, 1] after every step
    postprocess: bool = True  # enhance the decoded image with the shipped U-Net
    weights: str | None = None  # another enhancement U-Net (safetensors), e.g. from train-postprocessor
    label_method: Literal["auto", "bias", "weight"] = "auto"
    history: int = 20  # L-BFGS memory
    refine: int = 0  # extra iterations on a latent twice as fine (scale/2), started from the result
    init: InitKind = "rand"  # the image the latent is encoded from (Yue et al.: U(0, 1) noise)

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'rog': iterations must be >= 1")
        check(self.lr > 0, "attack 'rog': lr must be > 0")
        check(self.scale >= 1, "attack 'rog': scale must be >= 1")
        check(self.tv >= 0, "attack 'rog': tv must be >= 0")
        check(self.history >= 1, "attack 'rog': history must be >= 1")
        check(self.refine >= 0, "attack 'rog': refine must be >= 0")


@dataclass
class ROGSignOptions(ROGOptions):
    iterations: int = 400
    optimizer: Literal["lbfgs", "adam"] = "adam"
    tv: float = 0.0
    anneal: bool = False
    # signSGD: 1-bit updates carry no magnitude, so no U-Net by default
    postprocess: bool = False
    equalize: bool = True  # histogram equalisation after max-abs normalisation (paper Fig. 7)
    # tanh(g′/s): s = "rms" scales each simulated tensor by its detached RMS so tanh
    # is neither saturated nor linear whatever lr·τ makes the update's magnitude;
    # "none" is the paper's literal tanh(g′).
    tanh_scale: Literal["rms", "none"] = "rms"


class BicubicLatent:
    """enc: bicubic ×1/scale down-sampling; dec: bicubic up-sampling to (H, W)."""

    def __init__(self, image_shape: tuple[int, ...], scale: int):
        self.channels, self.height, self.width = image_shape
        self.size = (max(1, round(self.height / scale)), max(1, round(self.width / scale)))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=self.size, mode="bicubic", align_corners=False, antialias=True)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return F.interpolate(z, size=(self.height, self.width), mode="bicubic", align_corners=False)


class ROG(ResumableAttack):
    """Gradient matching in a bicubic latent space, L2 distance, U-Net postprocessing."""

    name = "rog"
    budgets = {"thorough": {"iterations": 200, "refine": 100}}
    Options = ROGOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels", "local_training", "defenses", "prior_data"})
    modalities = ("image",)
    # Divide the distance by its value at the starting point: FedAvg deltas of a
    # default-initialised model give L2 distances of ~1e-7, where Adam's eps and
    # L-BFGS's tolerances would stall the optimiser.
    normalise = True

    def objective(self, simulated: Tensors, target: Tensors) -> torch.Tensor:
        return update_distance(simulated, target, self.options.distance)

    def budget(self) -> int:
        return self.options.iterations + self.options.refine

    def observed_target(self, sim: UpdateSimulator) -> Tensors:
        return sim.target

    def finish(self, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return x.clamp(0, 1), {}

    def rungs(self, obs: Observation, ctx: AttackContext) -> Iterator[Reconstruction]:
        opt = self.options
        sim = make_simulator(obs, ctx.device)
        labels = recover_labels(obs, opt.label_method, ctx.generator(17)).to(ctx.device)
        latent = BicubicLatent(obs.input_shape, opt.scale)
        noise = observed_start(opt.init, (obs.batch_size, *obs.input_shape), ctx.generator(0), obs, labels, ctx,
                               learned=learned_start)
        # one Matching for both stages: the refinement keeps the coarse stage's normalisation
        matching = Matching(sim, self.observed_target(sim), self.objective, normalise=self.normalise)
        if opt.optimizer == "lbfgs":
            # unit steps with a line search; tolerances off: the normalised objective's
            # gradients are tiny per latent entry
            optimizer = Optimizer("lbfgs", 1.0, inner=1, history=opt.history, line_search=True, tolerances=False)
        else:
            optimizer = Optimizer("adam", opt.lr, schedule="cosine" if opt.anneal else "constant", final_lr=0.1)
        total = opt.iterations + opt.refine
        started = time.perf_counter()

        def stage(start: torch.Tensor, space: BicubicLatent, iterations: int, done: int):
            return Engine(matching=matching, labels=FixedLabels(labels),
                          candidates=lambda r: Latent(start, space.decode, box=opt.box and opt.optimizer == "adam"),
                          optimizer=optimizer, priors=[TotalVariation(opt.tv)], iterations=iterations,
                          keep_best=True, model=sim.model, trace_every=10, progress=ctx.progress, deadline=ctx.deadline,
                          progress_offset=done, progress_total=total, started=started).start()

        run = stage(latent.encode(noise).to(ctx.device), latent, opt.iterations, 0)
        out = run.advance(opt.iterations)
        coarse = out
        if opt.refine and math.isfinite(out.distance):
            # coarse-to-fine: continue on a latent twice as fine, started from the coarse image
            latent = BicubicLatent(obs.input_shape, max(1, opt.scale // 2))
            run = stage(latent.encode(out.inputs), latent, opt.refine, opt.iterations)
            out = run.advance(opt.refine)
        done = total
        while True:
            trace = coarse.trace_fields()
            evaluations = coarse.evaluations
            if out is not coarse:
                evaluations += out.evaluations
                for key, values in out.trace_fields().items():
                    trace[key] += values
            image, extras = self.finish(out.inputs.cpu())
            if opt.postprocess:
                from ...postprocess import enhance, load_enhancer

                image = enhance(image, load_enhancer(opt.weights))
            extras.update(latent_dim=int(math.prod(latent.size)) * obs.input_shape[0], evaluations=evaluations)
            yield Reconstruction(inputs=image, labels=labels.cpu(), iterations=done,
                                 final_distance=out.distance, **trace, extras=extras)
            # the next rung doubles the budget by continuing the last stage
            following = run.advance(done)
            if out is coarse:
                coarse = following
            out = following
            done *= 2


class ROGSign(ROG):
    """ROG against signSGD: ‖tanh(g′) − sign(g)‖² (Yue et al., Eq. 15)."""

    name = "rog-sign"
    budgets = {"thorough": {"iterations": 800}}
    Options = ROGSignOptions
    normalise = False  # tanh(g′) − sign(g) is already O(1) per entry

    def observed_target(self, sim: UpdateSimulator) -> Tensors:
        # Works on a sign-compressed update and on a raw one (it is signed here).
        return {n: t.sign() for n, t in sim.target.items()}

    def objective(self, simulated: Tensors, target: Tensors) -> torch.Tensor:
        total = 0.0
        for name, t in target.items():
            g = simulated[name]
            if self.options.tanh_scale == "rms":
                g = g / (g.detach().pow(2).mean().sqrt() + 1e-12)
            total = total + (torch.tanh(g) - t).pow(2).sum()
        return total

    def finish(self, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Max-abs normalisation per image, then optional histogram equalisation."""
        peak = x.flatten(1).abs().amax(1).clamp(min=1e-12).view(-1, *[1] * (x.dim() - 1))
        image = (x / peak).clamp(0, 1)
        if self.options.equalize:
            image = equalize_histogram(image)
        return image, {}


# A channel whose values span less than this is flat: there is no contrast to stretch, and
# skimage's 256-bin histogram cannot even be built on it (a flat start moved by one step).
FLAT_RANGE = 1e-6


def equalize_histogram(images: torch.Tensor) -> torch.Tensor:
    """Per image and channel, skimage's global histogram equalisation (flat channels kept)."""
    from skimage.exposure import equalize_hist

    out = torch.empty_like(images)
    for i in range(images.shape[0]):
        for c in range(images.shape[1]):
            channel = images[i, c].numpy()
            flat = not float(channel.max() - channel.min()) > FLAT_RANGE  # NaN counts as flat
            out[i, c] = torch.from_numpy(channel if flat else equalize_hist(channel))
    return out
