"""A gallery's LPIPS features kept on disk between processes (gradleak.metrics.reidentify).

A study's gallery is the same examples in every process and run. Their LPIPS unit features
(1,000 AlexNet passes on 64 px upsampled digits: most of a first judging, docs/judging.md)
and each image's weighted norms per layer (the |b|²_w of `distance_matrix.lpips_matrix`) are
kept in the user cache (`gradleak.data.sources.cache_dir`, folder `lpips-gallery`) as one
safetensors file per gallery and backbone. The file's name is a digest of everything its
contents follow from: the gallery's bytes and shape, the backbone's weights file (its path,
size and modification time), the torch version that computed them and FORMAT (raised
whenever the feature computation changes), so a changed gallery, other weights or another
torch never read stale features. A damaged or
foreign file is computed again and rewritten; a read-only or full cache only costs the
computation next time.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import torch

# Raised when what is kept, or how it is computed, changes (1: torch.save'd features alone).
FORMAT = 2
# Galleries whose kept tensors would exceed this are not written (their features are kept in
# memory for the process only).
KEPT_BYTES = 512 * 2 ** 20


@functools.lru_cache(maxsize=None)
def weights_digest(backbone: str) -> str:
    """What identifies the LPIPS weights of `backbone`: their file's path, size and modification
    time (a stat; hashing the 10 MB of AlexNet weights would cost a tenth of a judging)."""
    from .lpips import lpips_weights_path

    path = lpips_weights_path(backbone)
    stat = path.stat()
    return hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()


def kept_path(inputs: torch.Tensor, backbone: str) -> Path:
    """Where the LPIPS features of a gallery with these `inputs` are kept."""
    from ..data.sources import cache_dir

    flat = inputs.detach().float().cpu().contiguous()
    digest = hashlib.sha256(f"{FORMAT}:{backbone}:{weights_digest(backbone)}:{torch.__version__}:"
                            f"{tuple(flat.shape)}".encode())
    digest.update(flat.numpy().tobytes())
    return cache_dir() / "lpips-gallery" / f"{digest.hexdigest()[:32]}.safetensors"


def read_kept(inputs: torch.Tensor, backbone: str) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """The kept (features, norms) per layer of a gallery with these `inputs`; None when none
    are kept or the file is not what it should be."""
    from safetensors.torch import load_file

    path = kept_path(inputs, backbone)
    if not path.is_file():
        return None
    try:
        tensors = load_file(path)
    except Exception:  # damaged or foreign: computed again and rewritten
        return None
    layers = sum(1 for key in tensors if key.startswith("features."))
    try:
        features = [tensors[f"features.{k}"] for k in range(layers)]
        norms = [tensors[f"norms.{k}"] for k in range(layers)]
    except KeyError:
        return None
    size = len(inputs)
    if not layers or not all(len(t) == size for t in features + norms):
        return None
    return features, norms


def keep(inputs: torch.Tensor, backbone: str, features: list[torch.Tensor], norms: list[torch.Tensor]) -> None:
    """Write a gallery's LPIPS (features, norms) for later processes (`read_kept`)."""
    from safetensors.torch import save_file

    if sum(t.numel() * t.element_size() for t in features + norms) > KEPT_BYTES:
        return
    path = kept_path(inputs, backbone)
    tensors = {**{f"features.{k}": t.contiguous() for k, t in enumerate(features)},
               **{f"norms.{k}": t.contiguous() for k, t in enumerate(norms)}}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata={"format": str(FORMAT), "backbone": backbone})
        os.replace(tmp, path)
    except OSError:  # a read-only or full cache: the features are simply computed next time
        tmp.unlink(missing_ok=True)  # a half-written file left by a full disk
