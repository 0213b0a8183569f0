"""A binning imprint in the model's own latent space, without changing its architecture:
Scale-MIA-style (Shi et al., "Scale-MIA: A Scalable Model Inversion Attack against Secure
Federated Learning via Latent Space Reconstruction", NDSS 2025).

Robbing the Fed (`rtf`) and `loki` put an imprint block in front of the model, which a client
sees as a changed structure. Scale-MIA keeps the model the client expects and writes the
imprint into it: the layers in front of a dense layer are the encoder, that dense layer the
bins, and the latent vectors the bins recover are decoded back to inputs. Here:

- **Bins**: every unit of the first dense layer followed by ReLU gets the same query q over its
  input features h (the encoder's output, the model's own layers left as they are) and a
  threshold at a quantile of q·h, so unit k is active for the examples with q·h above c_k.
- **Read-out**: the next dense layer's columns for those units are one positive vector u (its
  bias positive, so the ReLU behind it stays open), so every active bin back-propagates the same
  signal per example; Robbing the Fed's read-out, made of the model's own next layer.
- **Decoding**: consecutive bins' gradients differ by the examples between their thresholds;
  an example alone in its bin gives h = ΔW_k / Δb_k exactly, through secure aggregation too
  (every client gets the same model, so the aggregate is one larger batch in the same bins).
  Behind convolutions h is inverted to pixels through the known encoder (`solvers.features`,
  sigmoid pixels, a TV prior, the starts `dense-vertices` uses); on the input it is the input.

Where we differ from the paper: Scale-MIA trains an autoencoder on auxiliary data and sends its
encoder as the model's first layers, keeping the decoder; this attack keeps the model's own
encoder and decodes by inversion, so it needs no training and no auxiliary data beyond the
thresholds' calibration (held-out examples when `prior_data` is granted, else pen strokes and
photograph crops, `gradleak.data.auxiliary`). Tried on seed 1 (ReLU LeNet-5, batch 64): the
LeNet-5 encoder trained with an MLP decoder on 5,000 held-out digits (20 epochs) gave 20 of 64
recognisable through its decoder and 34 by inversion through it, against 36 with the model's
own encoder inverted.

The disguise (`disguise`, on by default) is ours: Scale-MIA's crafted layers are, like Robbing
the Fed's, rows on one query and a read-out of rank one, which gradleak's guard flags from the
model alone (docs/guard.md). Like Robbing the Fed it assumes the bins do not
move during the round: one local step (`loki` is the imprint that survives several).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from ...errors import GradleakError
from ...fl.training import TrainingSpec
from ...options import check
from ...solvers.features import FeatureExtractor, FeatureInversionOptions, invert_features
from ...threat import Observation
from ..analytic.spear import DenseReLU, locate_dense_relu
from ..base import Attack, AttackContext, PreparedModel, Reconstruction, check_result
from ..replay.labels import recover_labels

# logit levels the inversions start from (mid-gray, dark, bright), the best kept per image
INVERSION_STARTS = (0.0, -3.0, 3.0)
CALIBRATION_EXAMPLES = 5000
# the share of the feature space, least varied over the calibration features, that a disguised
# row's random part lies in: LeNet-5 (ReLU) on MNIST, the quietest tenth varies ~1e-7 as much as
# all of it, the quietest half ~2e-5, where a part 3 times the query's size already mixes its
# 120 bins (seed 1: 14 % recognisable at batch 64, against 61 % plain)
QUIET_SHARE = 0.1


@dataclass
class ScaleMIAOptions:
    query: Literal["gaussian", "mean"] = "gaussian"  # a random direction over the features, or their mean's
    calibration: Literal["auto", "prior", "public"] = "auto"  # auto = prior if granted, else strokes and photos
    layer: str = ""  # the bins' dense layer (module name); "" = the first one followed by ReLU
    readout: float = field(default=1.0, metadata={"range": (1e-9, 1e9)})  # size of the next layer's shared column
    # disguise: each bin's row gets a random part this many times the query's size, drawn where
    # the calibration features barely vary, and the read-out's columns a random part the signal
    # never reaches; rows and read-out scaled to the layers' own sizes (0: the plain imprint)
    disguise: float = field(default=0.3, metadata={"range": (0.0, 1e6)})
    # a bin whose bias difference is below this fraction of the largest counts as empty
    min_difference: float = field(default=1e-4, metadata={"range": (0.0, 1.0)})
    feature_steps: int = field(default=1000, metadata={"range": (1, 100_000)})  # inversion to pixels
    feature_lr: float = 0.05
    feature_tv: float = 0.1

    def __post_init__(self):
        check(self.readout > 0, "attack 'scale-mia': readout must be > 0")
        check(self.disguise >= 0, "attack 'scale-mia': disguise must be >= 0")
        check(self.feature_steps >= 1, "attack 'scale-mia': feature_steps must be >= 1")
        check(self.feature_lr > 0, "attack 'scale-mia': feature_lr must be > 0")
        check(self.feature_tv >= 0, "attack 'scale-mia': feature_tv must be >= 0")


@dataclass(frozen=True)
class LatentBins:
    """What the server keeps: the bins' layer, the layer it crafted as their read-out, the query
    and the thresholds in the order of the layer's units, and whether the bins see the input."""

    layer: str
    readout_layer: str
    query: torch.Tensor
    thresholds: torch.Tensor
    on_input: bool  # the bins see the input itself (else features, inverted to inputs)


def readout_layer(model: nn.Module, layer: DenseReLU) -> str:
    """The dense layer that reads the bins: the next nn.Linear (in registration order, the order
    gradleak's sequential models run in) that takes the bins' layer's outputs."""
    leaves = [(n, m) for n, m in model.named_modules() if not list(m.children())]
    names = [n for n, _ in leaves]
    for name, module in leaves[names.index(layer.name) + 1:]:
        if isinstance(module, nn.Linear):
            if module.in_features != layer.module.out_features:
                break
            return name
        if not isinstance(module, (nn.ReLU, nn.Dropout, nn.Identity, nn.Flatten)):
            break
    raise GradleakError(f"attack 'scale-mia': layer '{layer.name}' is not read by a dense layer of "
                        f"{layer.module.out_features} inputs (its read-out)")


def calibration_inputs(input_shape: tuple[int, ...], prior_data, calibration: str,
                       generator: torch.Generator) -> torch.Tensor:
    """Where the thresholds come from: held-out examples, else pen strokes and photograph crops
    (images) or standard normal records (tabular data)."""
    if calibration == "prior" or (calibration == "auto" and prior_data is not None):
        if prior_data is None:
            raise GradleakError("attack 'scale-mia': calibration=prior needs held-out data (--knows prior_data)")
        return prior_data.inputs[:CALIBRATION_EXAMPLES].float()
    from ...data.auxiliary import pen_strokes, public_images

    count = 2000
    if len(input_shape) != 3:  # not images: records standardised, as gradleak's tabular data are
        return torch.randn(count, *input_shape, generator=generator)
    out = torch.empty(count, *input_shape)
    out[0::2] = pen_strokes(input_shape, len(out[0::2]), generator)
    out[1::2] = public_images(input_shape, len(out[1::2]), generator)
    return out


def bins_from(gradient_w: torch.Tensor, gradient_b: torch.Tensor, thresholds: torch.Tensor,
              min_difference: float) -> torch.Tensor:
    """The latent vectors of the examples alone in their bins, from the bins' layer's gradient
    (or update: the ratio is the same), units in any order (`thresholds` sorts them)."""
    order = thresholds.argsort()  # ascending: unit k holds every example above c_k
    g_w, g_b = gradient_w.double()[order], gradient_b.double()[order]
    d_w = g_w - torch.cat([g_w[1:], torch.zeros_like(g_w[:1])])
    d_b = g_b - torch.cat([g_b[1:], torch.zeros_like(g_b[:1])])
    occupied = d_b.abs() > min_difference * d_b.abs().max().clamp_min(1e-300)
    return (d_w[occupied] / d_b[occupied, None]).float()


def disguised_rows(query: torch.Tensor, features: torch.Tensor, units: int, disguise: float,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The bins' rows: the query plus, with `disguise` > 0, a random part `disguise` times its
    size in the tenth of the feature space where the calibration features vary least, so that a
    row's extra projection is nearly the same for every example (the mean's, taken into the
    threshold: the returned offsets) and the bins keep their order. The rows then look unrelated
    (no two near-parallel), and the decoding is unchanged: a bin's gradient does not depend on
    its row."""
    rows = query.reshape(1, -1).expand(units, -1).clone()
    if disguise <= 0:
        return rows, torch.zeros(units, dtype=rows.dtype)
    centred = features - features.mean(0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    quiet = vh[-max(1, round(QUIET_SHARE * vh.shape[0])):]
    noise = torch.randn(units, quiet.shape[0], generator=generator, dtype=rows.dtype) @ quiet
    noise = disguise * query.norm() * noise / noise.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return rows + noise, noise @ features.mean(0)


def disguise_readout(model: nn.Module, read_name: str, inputs: torch.Tensor, num_classes: int, disguise: float,
                     size: torch.Tensor, generator: torch.Generator) -> None:
    """Adds to the read-out's shared column a random part per bin in the directions that the
    signal back-propagated to the read-out's outputs never takes (measured on the calibration
    inputs with random labels: their complement), so every bin still receives the same signal
    per example while the read-out is no longer of rank one; then scales it to `size` (its own
    norm before crafting) and opens the ReLU behind it for the calibration inputs."""
    read = model.get_submodule(read_name)
    captured: dict[str, torch.Tensor] = {}

    def keep(_module, _inputs, output):
        captured["z"] = output

    was = model.training
    model.eval()
    hook = read.register_forward_hook(keep)
    try:
        x = inputs[:1000]
        labels = torch.randint(0, num_classes, (len(x),), generator=generator)
        with torch.enable_grad():
            loss = nn.functional.cross_entropy(model(x), labels, reduction="sum")
            (signal,) = torch.autograd.grad(loss, captured["z"])
        _, s, vh = torch.linalg.svd(signal.double(), full_matrices=True)
        rank = int((s > 1e-6 * s.max().clamp_min(1e-300)).sum())
        unused = vh[rank:]
        if len(unused) == 0:
            return
        with torch.no_grad():
            weight = read.weight.double()
            column = weight[:, :1]
            noise = unused.T @ torch.randn(len(unused), weight.shape[1], generator=generator, dtype=torch.float64)
            noise = disguise * column.norm() * noise / noise.norm(dim=0, keepdim=True).clamp_min(1e-300)
            weight = weight + noise
            weight = weight * (size.double() / weight.norm())
            read.weight.copy_(weight.float())
            if read.bias is not None:
                # open for the calibration inputs with a margin: the bins' largest pull below zero
                captured.clear()
                model(x)
                low = (captured["z"] - read.bias).amin(0).detach()
                read.bias.copy_((1.0 - 2 * low.clamp(max=0)).float())
    finally:
        hook.remove()
        model.train(was)


class ScaleMIA(Attack):
    """Bins written into the model's own first dense+ReLU layer; latent vectors decoded by inversion."""

    name = "scale-mia"
    Options = ScaleMIAOptions
    requires = frozenset({"batch_size"})
    uses = frozenset({"prior_data", "labels"})
    modalities = ("image", "tabular")
    malicious = True

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: self._layers(model, input_shape)))

    def _layers(self, model: nn.Module, input_shape: tuple[int, ...]) -> tuple[DenseReLU, str]:
        layer = locate_dense_relu(model, input_shape, self.options.layer, self.name)
        return layer, readout_layer(model, layer)

    def blind_to(self, training: TrainingSpec) -> str | None:
        if not training.is_fedsgd:
            return "reads bins that stay put over one local step (loki's bins survive several)"
        return None

    def prepare_model(self, model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                      ctx: AttackContext) -> PreparedModel:
        opt = self.options
        layer, read_name = self._layers(model, input_shape)
        gen = ctx.generator(131)
        inputs = calibration_inputs(tuple(input_shape), ctx.prior_data, opt.calibration, gen)
        with torch.no_grad():
            was = model.training
            model.eval()
            try:
                extract = FeatureExtractor(model, layer.name)
                features = torch.cat([extract(inputs[a:a + 1000]) for a in range(0, len(inputs), 1000)]).double()
            finally:
                model.train(was)
        if opt.query == "mean":
            query = features.mean(0)
        else:
            query = torch.randn(features.shape[1], generator=gen, dtype=torch.float64)
        query = query / query.norm().clamp_min(1e-300)
        units = layer.module.out_features
        levels = (torch.arange(units, dtype=torch.float64) + 0.5) / units
        thresholds = torch.quantile(features @ query, levels)
        thresholds[0] = thresholds[0] - 1e3 * (thresholds[-1] - thresholds[0]).abs().clamp_min(1.0)  # a bin for all
        rows, offsets = disguised_rows(query, features, units, opt.disguise, gen)
        read = model.get_submodule(read_name)
        with torch.no_grad():
            # each row at the size of the layer's own (the bins' order and the decoding do not
            # depend on a row's positive scale)
            own = layer.module.weight.double().norm(dim=1, keepdim=True).clamp_min(1e-12)
            size = own / rows.norm(dim=1, keepdim=True)
            layer.module.weight.copy_((rows * size).float())
            layer.module.bias.copy_((-(thresholds + offsets) * size[:, 0]).float())
            shared = torch.rand(read.out_features, 1, generator=gen) + 0.5
            read_size = read.weight.norm()
            read.weight.copy_(opt.readout * shared / shared.norm() * torch.ones(1, units) / units)
            if read.bias is not None:
                read.bias.fill_(1.0)  # the ReLU behind the read-out open for every example
        if opt.disguise > 0:
            disguise_readout(model, read_name, inputs, num_classes, opt.disguise, read_size, gen)
        secrets = LatentBins(layer.name, read_name, query.float(), thresholds.float(), layer.on_input)
        return PreparedModel(model, secrets)

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        secrets = obs.server_secrets
        if not isinstance(secrets, LatentBins):
            raise GradleakError("attack 'scale-mia': no bins in the model (run it with --threat malicious so the "
                                "server can send its crafted model)")
        update = obs.update.tensors
        weight, bias = update.get(f"{secrets.layer}.weight"), update.get(f"{secrets.layer}.bias")
        if weight is None or bias is None:
            raise GradleakError(f"attack 'scale-mia': the update has no tensors for layer '{secrets.layer}'")
        latent = bins_from(weight, bias, secrets.thresholds, self.options.min_difference)
        shape = tuple(obs.input_shape)
        if secrets.on_input:
            x = latent.reshape(-1, *shape)
        else:
            opt = self.options
            extract = FeatureExtractor(obs.model, secrets.layer)
            inversion = FeatureInversionOptions(opt.feature_steps, opt.feature_lr, opt.feature_tv, "sigmoid",
                                                starts=INVERSION_STARTS)
            with torch.enable_grad():
                x = invert_features(extract, latent, shape, inversion, generator=ctx.generator(43))
        x = obs.kind.clamp(x)
        labels = recover_labels(obs, "auto", ctx.generator(17))
        return Reconstruction(inputs=x, labels=labels, extras={"occupied_bins": int(latent.shape[0]),
                                                                "bins": int(weight.shape[0])})
