"""The ground-truth exchange of a Flower audit: the client mod writes the examples an audited
client trains on to a file of the simulation's output folder (never into a Flower message),
and the server side reads them back to score the attacks."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import GradleakError


def write_truth(path: Path, inputs, labels, partition) -> None:
    from safetensors.torch import save_file

    x = torch.as_tensor(inputs).detach().cpu()
    x = (x if not x.dtype.is_floating_point else x.float()).contiguous()  # token ids stay integers
    y = torch.as_tensor(labels).detach().long().cpu().contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tensors = {"inputs": x, "labels": y}
    if partition is not None:
        tensors["partition"] = torch.tensor([int(partition)])
    save_file(tensors, str(tmp))
    tmp.replace(path)


def read_truth(path: Path) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise GradleakError(f"FlowerAudit: no ground truth at {path}: add audit.client_mod to the ClientApp's "
                            "mods (gradleak audits Flower simulations, where the examples can be scored)")
    try:
        tensors = load_file(str(path))
    except Exception as exc:
        raise GradleakError(f"FlowerAudit: ground truth file {path} is unreadable ({exc})") from None
    partition = int(tensors["partition"][0]) if "partition" in tensors else None
    return tensors["inputs"], tensors["labels"], partition
