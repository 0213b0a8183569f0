"""ROG: Reconstruction from Obfuscated Gradients (Yue et al., paper 02).

The unknowns are a low-dimensional latent Z per image — by default the image
bicubic-downsampled ×1/4 (d_z = HW/16 per channel) — decoded by bicubic
up-sampling, `X̂ = dec(Z)`. Z starts as enc(U(0,1) noise) and is optimised with
Adam to minimise the L2 distance ‖Δ′ − Δ̃‖² (Eq. 14) between the update the
client would send for X̂ (FedSGD gradient, or the FedAvg delta with the τ local
steps unrolled by `UpdateSimulator`) and the observed, possibly compressed,
update. The decoded image is finally enhanced by a small U-Net
(`gradleak.postprocess`), which plays the role of the image prior.

`rog-sign` (paper 02, §4.3 "Reconstruction from signSGD", Eq. 15) matches
tanh(g′) to sign(g); magnitudes are lost, so the image is optimised without a
box constraint, normalised by its maximum absolute value and optionally
histogram-equalised.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from ..options import check
from ..threat import Observation
from .base import Attack, AttackContext, Reconstruction
from .labels import recover_labels
from .matching import UpdateSimulator, finite_or_inf, total_variation, update_distance

Tensors = dict[str, torch.Tensor]


@dataclass
class ROGOptions:
    iterations: int = 400
    lr: float = 0.05
    scale: int = 4  # bicubic down-sampling factor of the latent (paper: 4)
    distance: Literal["l2", "cosine"] = "l2"  # paper: l2 (Eq. 14)
    tv: float = 0.0  # optional TV on the decoded image (ROG relies on the U-Net instead)
    postprocess: bool = True  # enhance the decoded image with the shipped U-Net
    weights: str | None = None  # another enhancement U-Net (safetensors), e.g. from train-postprocessor
    label_method: Literal["auto", "bias", "weight"] = "auto"

    def __post_init__(self):
        check(self.iterations >= 1, "attack 'rog': iterations must be >= 1")
        check(self.lr > 0, "attack 'rog': lr must be > 0")
        check(self.scale >= 1, "attack 'rog': scale must be >= 1")
        check(self.tv >= 0, "attack 'rog': tv must be >= 0")


@dataclass
class ROGSignOptions(ROGOptions):
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


class ROG(Attack):
    """Gradient matching in a bicubic latent space, L2 distance, U-Net postprocessing."""

    name = "rog"
    Options = ROGOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"labels", "local_training"})
    modalities = ("image",)

    def objective(self, simulated: Tensors, target: Tensors) -> torch.Tensor:
        return update_distance(simulated, target, self.options.distance)

    def observed_target(self, sim: UpdateSimulator) -> Tensors:
        return sim.target

    def box(self) -> bool:
        """Keep the latent in [0, 1] (pixel range) during optimisation."""
        return True

    def finish(self, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return x.clamp(0, 1), {}

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        opt = self.options
        sim = UpdateSimulator(obs, ctx.device)
        target = self.observed_target(sim)
        labels = recover_labels(obs, opt.label_method, ctx.generator(17)).to(ctx.device)
        latent = BicubicLatent(obs.input_shape, opt.scale)
        noise = torch.rand((obs.batch_size, *obs.input_shape), generator=ctx.generator(0))
        z = latent.encode(noise).to(ctx.device).requires_grad_(True)
        optimizer = torch.optim.Adam([z], lr=opt.lr)
        trace: list[float] = []
        for it in range(opt.iterations):
            optimizer.zero_grad(set_to_none=True)
            x = latent.decode(z)
            distance = self.objective(sim(x, labels), target)
            loss = distance + (opt.tv * total_variation(x) if opt.tv else 0.0)
            loss.backward()
            optimizer.step()
            if self.box():
                with torch.no_grad():
                    z.clamp_(0, 1)
            if it % 25 == 0 or it == opt.iterations - 1:
                trace.append(float(distance.detach()))
                if ctx.progress:
                    ctx.progress(it + 1, opt.iterations, float(distance.detach()))
        decoded = latent.decode(z.detach())
        final = finite_or_inf(self.objective(sim(decoded, labels), target))  # sim needs autograd
        image, extras = self.finish(decoded.detach().cpu())
        if opt.postprocess:
            from ..postprocess import enhance, load_enhancer

            image = enhance(image, load_enhancer(opt.weights))
        extras["latent_dim"] = int(z[0].numel())
        return Reconstruction(inputs=image, labels=labels.cpu(), iterations=opt.iterations,
                              final_distance=final, trace=trace, extras=extras)


class ROGSign(ROG):
    """ROG against signSGD: ‖tanh(g′) − sign(g)‖² (paper 02, Eq. 15)."""

    name = "rog-sign"
    Options = ROGSignOptions

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

    def box(self) -> bool:
        return False

    def finish(self, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Max-abs normalisation per image, then optional histogram equalisation."""
        peak = x.flatten(1).abs().amax(1).clamp(min=1e-12).view(-1, *[1] * (x.dim() - 1))
        image = (x / peak).clamp(0, 1)
        if self.options.equalize:
            image = equalize_histogram(image)
        return image, {}


def equalize_histogram(images: torch.Tensor) -> torch.Tensor:
    """Per image and channel, skimage's global histogram equalisation."""
    from skimage.exposure import equalize_hist

    out = torch.empty_like(images)
    for i in range(images.shape[0]):
        for c in range(images.shape[1]):
            channel = images[i, c].numpy()
            out[i, c] = torch.from_numpy(equalize_hist(channel) if channel.max() > channel.min() else channel)
    return out
