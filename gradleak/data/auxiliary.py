"""Public auxiliary images: what an honest server without the client's data can train on.

Random crops of the photographs that ship with scikit-image and scikit-learn, at random
scale, flipped at random and resized to the target's resolution and channels. None of them
is an image of a dataset gradleak reports on, so an attack trained on them (the learned
inverter) is tuned apart from the images it is scored on.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import GradleakError

# scikit-image's bundled photographs (no download); scikit-learn's two sample photos come on top
SKIMAGE_PHOTOS = ("astronaut", "brick", "camera", "chelsea", "clock", "coffee", "coins", "grass", "gravel",
                  "hubble_deep_field", "immunohistochemistry", "moon", "page", "rocket", "text")


def _photos() -> list[torch.Tensor]:
    """The photographs as float (C, H, W) tensors in [0, 1], C = 1 or 3."""
    try:
        import skimage.data
        from sklearn.datasets import load_sample_images
    except ImportError as exc:
        raise GradleakError(f"public auxiliary images need scikit-image and scikit-learn ({exc})") from None
    arrays = [np.asarray(getattr(skimage.data, name)()) for name in SKIMAGE_PHOTOS]
    arrays += list(load_sample_images().images)
    photos = []
    for array in arrays:
        tensor = torch.from_numpy(np.array(array, dtype=np.float32)) / 255.0
        photos.append(tensor[None] if tensor.dim() == 2 else tensor[..., :3].permute(2, 0, 1))
    return photos


def _to_channels(image: torch.Tensor, channels: int) -> torch.Tensor:
    if image.shape[0] == channels:
        return image
    if channels == 1:  # ITU-R BT.601 luma, as PIL's convert("L")
        return (image * torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)).sum(0, keepdim=True)
    return image.expand(channels, *image.shape[1:])


def public_images(input_shape: tuple[int, ...], count: int, generator: torch.Generator) -> torch.Tensor:
    """`count` images of `input_shape` (C, H, W) in [0, 1]: each a crop of a random photograph,
    its side between a sixteenth and a half of the photograph's shorter side, flipped with
    probability ½, resized (bilinear, antialiased) to H × W."""
    if len(input_shape) != 3:
        raise GradleakError(f"public auxiliary images are images; input shape {tuple(input_shape)} is not (C, H, W)")
    channels, height, width = input_shape
    photos = _photos()
    out = torch.empty(count, channels, height, width)
    for i in range(count):
        photo = photos[int(torch.randint(len(photos), (), generator=generator))]
        short = min(photo.shape[1:])
        side = int(torch.randint(max(height, short // 16), max(height, short // 2) + 1, (), generator=generator))
        aspect = width / height
        crop_h, crop_w = min(side, photo.shape[1]), min(int(round(side * aspect)), photo.shape[2])
        top = int(torch.randint(photo.shape[1] - crop_h + 1, (), generator=generator))
        left = int(torch.randint(photo.shape[2] - crop_w + 1, (), generator=generator))
        crop = photo[:, top:top + crop_h, left:left + crop_w]
        if bool(torch.rand((), generator=generator) < 0.5):
            crop = crop.flip(-1)
        crop = F.interpolate(crop[None], size=(height, width), mode="bilinear", antialias=True,
                             align_corners=False)[0]
        out[i] = _to_channels(crop, channels).clamp(0, 1)
    return out


def pen_strokes(input_shape: tuple[int, ...], count: int, generator: torch.Generator) -> torch.Tensor:
    """`count` images of `input_shape` (C, H, W) in [0, 1], each one to four pen strokes: cubic
    Bézier curves with random control points in the central five sevenths of the frame (where
    MNIST centres its digits), white on black, of one random width (2–5 pixels at 28 × 28, scaled
    with the frame), anti-aliased over one pixel. Synthetic, so no dataset's images are in them."""
    if len(input_shape) != 3:
        raise GradleakError(f"pen strokes are images; input shape {tuple(input_shape)} is not (C, H, W)")
    channels, height, width = input_shape
    scale = min(height, width) / 28
    rows, cols = torch.meshgrid(torch.arange(height).float(), torch.arange(width).float(), indexing="ij")
    pixels = torch.stack([rows.flatten(), cols.flatten()], 1)
    steps = torch.linspace(0, 1, 24)
    bernstein = torch.stack([(1 - steps) ** 3, 3 * (1 - steps) ** 2 * steps, 3 * (1 - steps) * steps ** 2,
                             steps ** 3], 1)
    frame = torch.tensor([height, width]).float()
    out = torch.empty(count, channels, height, width)
    most = 4
    for a in range(0, count, 500):
        n = min(500, count - a)
        controls = (frame - 1) * (1 / 7 + 5 / 7 * torch.rand(n, most, 4, 2, generator=generator))
        points = torch.einsum("sc,nkcd->nksd", bernstein, controls).reshape(n, most * len(steps), 2)
        distance = torch.cdist(pixels.expand(n, -1, -1), points).reshape(n, -1, most, len(steps)).amin(3)
        strokes = torch.randint(1, most + 1, (n,), generator=generator)
        drawn = torch.arange(most)[None, None, :] < strokes[:, None, None]
        distance = torch.where(drawn, distance, torch.full_like(distance, float("inf"))).amin(2)
        radius = scale * (1.0 + 1.5 * torch.rand(n, 1, generator=generator))
        image = (radius + 0.5 - distance).clamp(0, 1).reshape(n, 1, height, width)
        out[a:a + n] = image.expand(n, channels, height, width)
    return out
