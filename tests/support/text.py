"""Shared pieces of the text tests: a small GPT-2, one FedSGD gradient, a seeded batch and the
news corpus at two lengths."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gradleak.data import text as text_data
from gradleak.models.base import ModelSpec
from gradleak.models.building import build
from gradleak.models.gpt2 import GPT2, build_gpt2, language_model_loss

VOCAB = text_data.VOCAB_SIZE
EOT = text_data.END_OF_TEXT
SMALL_GPT2 = {"width": 128, "heads": 4}


def gpt2(seq_len: int, classes: int = VOCAB, seed: int = 0, **options) -> GPT2:
    """GPT-2 at width 128 × 4 heads unless told otherwise: a third of the default's cost."""
    return build(ModelSpec("gpt2", (seq_len,), classes, seed=seed, options={**SMALL_GPT2, **options}), build_gpt2)


def client_gradient(model: GPT2, inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """One FedSGD gradient: next-token loss for an LM head, cross-entropy for a classifier."""
    out = model(inputs)
    loss = language_model_loss(out, labels) if out.dim() == 3 else F.cross_entropy(out, labels)
    names, params = zip(*model.named_parameters())
    return dict(zip(names, torch.autograd.grad(loss, params)))


def batch(dataset, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    index = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:size]
    return dataset.inputs[index], dataset.labels[index]
