"""Training of ROG's enhancement U-Net on degraded crops of offline photos."""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .unet import EnhancementUNet, degrade

# Natural photos that ship with installed packages. None is an evaluation target
# (skimage's `camera` is kept out: the tests use it as the held-out image).
SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
                  "immunohistochemistry", "retina", "coins", "moon", "grass", "gravel", "brick")


def training_photos() -> list[torch.Tensor]:
    """(3, H, W) float tensors in [0, 1]: skimage.data photos, sklearn's sample
    images and matplotlib's grace_hopper.jpg, all read offline."""
    import skimage.data
    from matplotlib import cbook
    from PIL import Image
    from sklearn.datasets import load_sample_images

    arrays = [getattr(skimage.data, name)() for name in SKIMAGE_PHOTOS]
    arrays += list(load_sample_images().images)
    with cbook.get_sample_data("grace_hopper.jpg") as fh:
        arrays.append(np.asarray(Image.open(fh).convert("RGB")))
    photos = []
    for a in arrays:
        a = np.asarray(a, dtype=np.float32) / 255.0
        if a.ndim == 2:
            a = np.repeat(a[..., None], 3, axis=2)
        photos.append(torch.from_numpy(np.ascontiguousarray(a[..., :3])).permute(2, 0, 1))
    return photos


def random_crops(photos: list[torch.Tensor], rng: random.Random, batch: int, size: int) -> torch.Tensor:
    """Crops at a random scale (objects in 128 px ImageNet-like images are large)
    with random flips."""
    crops = []
    for _ in range(batch):
        p = photos[rng.randrange(len(photos))]
        h, w = p.shape[-2:]
        scale = rng.uniform(max(size / min(h, w), 0.2), 1.0)
        side = min(int(size / scale), h, w)
        top, left = rng.randrange(h - side + 1), rng.randrange(w - side + 1)
        crop = p[:, top:top + side, left:left + side].unsqueeze(0)
        crop = F.interpolate(crop, size=(size, size), mode="area") if side != size else crop
        if rng.random() < 0.5:
            crop = crop.flip(-1)
        crops.append(crop)
    return torch.cat(crops)


def train_enhancer(steps: int = 1600, seed: int = 0, batch: int = 8, size: int = 64, lr: float = 1e-3,
                   progress: Callable[[int, int, float], None] | None = None) -> EnhancementUNet:
    """L1 training (Yue et al. use L1 + adversarial; the GAN part is left out for
    a CPU budget) with Adam and cosine learning-rate decay."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    photos = training_photos()
    model = EnhancementUNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    for step in range(steps):
        target = random_crops(photos, rng, batch, size)
        degraded = degrade(target, rng)
        loss = (model(degraded) - target).abs().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if progress is not None:
            progress(step + 1, steps, float(loss.detach()))
    return model.eval()


def save_enhancer(model: EnhancementUNet, path: str | Path) -> Path:
    """float16 safetensors (keeps the shipped file well under 2 MB)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    tmp = path.with_suffix(".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "arch": "EnhancementUNet", "saved": time.strftime("%Y-%m-%d")})
    tmp.replace(path)
    return path
