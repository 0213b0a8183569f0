"""Models: one module per architecture, one registry line each."""
from __future__ import annotations

from ..registry import Registry
from .base import ACTIVATIONS, ModelSpec, make_activation
from .building import build

MODELS: Registry = Registry("model", {
    "lenet": "gradleak.models.lenet:build_lenet",
    "lenet5": "gradleak.models.lenet5:build_lenet5",
    "lenet-rog": "gradleak.models.lenet_rog:build_lenet_rog",
    "convnet": "gradleak.models.convnet:build_convnet",
    "resnet18": "gradleak.models.resnet:build_resnet18",
    "resnet20": "gradleak.models.resnet:build_resnet20",
    "vgg16": "gradleak.models.vgg:build_vgg16",
    "mlp": "gradleak.models.mlp:build_mlp",
    "twolayer": "gradleak.models.twolayer:build_twolayer",
    "gpt2": "gradleak.models.gpt2:build_gpt2",
    "minilm": "gradleak.models.minilm:build_minilm",
})

__all__ = ["MODELS", "ModelSpec", "ACTIVATIONS", "make_activation", "build_model", "last_linear", "labels_shown"]


def build_model(spec: ModelSpec):
    """Build `spec.name` for the spec's input shape / classes with seeded init."""
    return build(spec, MODELS.get(spec.name))


def last_linear(model):
    """(qualified name, module) of the classifier head: the model's last nn.Linear."""
    from torch import nn

    found = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            found = (name, module)
    if found is None:
        raise ValueError("model has no linear layer")
    return found


def labels_shown(model, tensors, labels) -> dict | None:
    """The classes the head's bias update points at (negative entries of `tensors`, an update's
    tensors by parameter name: the loss pushed those logits up, so their examples were in the
    batch), against the classes trained on (`labels`): the label leakage of iDLG (Zhao et al.),
    exact for one FedSGD step. None when the model has no linear head with a bias in the update,
    or the labels are not one class per example."""
    try:
        name, head = last_linear(model)
    except ValueError:
        return None
    bias = tensors.get(f"{name}.bias")
    if head.bias is None or bias is None or labels.dim() != 1:
        return None
    shown = sorted(int(i) for i in (bias < 0).nonzero().flatten())
    present = sorted({int(v) for v in labels})
    return {"shown": shown, "present": present, "exact": shown == present}
