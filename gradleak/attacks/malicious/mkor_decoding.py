"""MKOR's image decoding: per-label conv features → images, from the crafted plan
(max/min bounds for max-pooling, a ridge solve for average pooling, interpolation
of exact point samples for stride-2 networks)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .mkor_crafting import Channel, ConvPlan

RIDGE = 1e-3  # regulariser of the average-pooling solve


def decode_images(features: torch.Tensor, input_shape, model: nn.Module, plan: ConvPlan,
                  smooth: int) -> torch.Tensor:
    """Per-label conv features [n, D] → images [n, C, H, W]."""
    colors, height, width = input_shape
    conv_out = feature_map_shape(model, input_shape)
    z = features.reshape(features.shape[0], *conv_out)
    z = z / plan.scale
    for gain, centre in reversed(plan.sigmoids):  # σ(g·(v − c)) → v
        z = torch.logit(z.double().clamp(1e-12, 1 - 1e-12)).float() / gain + centre
    if plan.pooling == "avg":
        return _deconvolve(z, colors, height, width, plan).clamp(0, 1)
    # work on cells of `step` pixels: every region edge falls on a cell edge (regions
    # tile the image since region == factor for 2×2 pools), saving a 16× larger canvas
    step = math.gcd(plan.factor, *[abs(c.off_h) for c in plan.channels.values()],
                    *[abs(c.off_w) for c in plan.channels.values()]) if plan.region > 1 else 1
    cells_h, cells_w = -(-height // step), -(-width // step)
    n = z.shape[0]
    block = plan.region // step if plan.region > 1 else 1
    inf = float("inf")
    upper = torch.full((n, colors, cells_h, cells_w), inf)
    lower = torch.full((n, colors, cells_h, cells_w), -inf)
    total = torch.zeros((n, colors, cells_h, cells_w))
    count = torch.zeros((n, colors, cells_h, cells_w))
    # group channels sharing an offset: one placement per (offset, colour, kind)
    groups: dict[tuple[int, int], list[tuple[int, Channel]]] = {}
    for idx, ch in plan.channels.items():
        groups.setdefault((ch.off_h, ch.off_w), []).append((idx, ch))
    for (off_h, off_w), members in groups.items():
        idx = torch.tensor([i for i, _ in members])
        vals = z[:, idx]  # [n, m, Hz, Wz]
        if plan.region > 1:
            tiles = vals.repeat_interleave(block, -2).repeat_interleave(block, -1)
            placed, valid = _place(tiles, off_h // step, off_w // step, cells_h, cells_w)
        else:  # exact point samples: write them straight into the running sums
            rows = torch.arange(vals.shape[-2]) * plan.factor + off_h
            cols = torch.arange(vals.shape[-1]) * plan.factor + off_w
            keep_r, keep_c = (rows >= 0) & (rows < height), (cols >= 0) & (cols < width)
            r, c = rows[keep_r][:, None], cols[keep_c][None, :]
            for j, (_, ch) in enumerate(members):
                total[:, ch.color, r, c] += vals[:, j][:, keep_r][:, :, keep_c]
                count[:, ch.color, r, c] += 1
            continue
        for j, (_, ch) in enumerate(members):
            v, ok = placed[:, j], valid[:, j]
            if plan.pooling == "max":
                if ch.kind == "max":
                    upper[:, ch.color] = torch.where(ok, torch.minimum(upper[:, ch.color], v),
                                                     upper[:, ch.color])
                else:
                    lower[:, ch.color] = torch.where(ok, torch.maximum(lower[:, ch.color], 1 - v),
                                                     lower[:, ch.color])
            else:
                total[:, ch.color] += torch.where(ok, v, torch.zeros_like(v))
                count[:, ch.color] += ok.float()
    if plan.pooling == "max":
        hi = torch.where(torch.isinf(upper), torch.ones_like(upper), upper).clamp(0, 1)
        lo = torch.where(torch.isinf(lower), torch.zeros_like(lower), lower).clamp(0, 1)
        cells = (hi + torch.minimum(lo, hi)) / 2  # eq. 19
        if smooth > 1:
            # the official code smooths the bound midpoint (5×5, near-box Gaussian)
            image = cells.repeat_interleave(step, -2).repeat_interleave(step, -1)[..., :height, :width]
            return _smooth(image, smooth)
    elif plan.pooling == "avg":
        cells = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
    else:
        cells = _interpolate(total, count, plan.factor, plan.channels)
    image = cells.repeat_interleave(step, -2).repeat_interleave(step, -1)
    return image[..., :height, :width]

def _deconvolve(z: torch.Tensor, colors: int, height: int, width: int, plan: ConvPlan) -> torch.Tensor:
    """Average pooling: each feature is (after inverting the sigmoids) the mean of
    x over its region; solve the under-determined linear system with the
    minimum-norm ridge solution x = Aᵀ(AAᵀ + λI)⁻¹v (zero padding counts as 0)."""
    items = sorted(plan.channels.items())
    hz, wz = z.shape[-2:]
    rows_per_color: dict[int, list[torch.Tensor]] = {}
    index_per_color: dict[int, list[tuple[int, int, int]]] = {}
    grid_h = torch.arange(height)[:, None]
    grid_w = torch.arange(width)[None, :]
    for idx, ch in items:
        for i in range(hz):
            top = i * plan.factor + ch.off_h
            in_h = (grid_h >= top) & (grid_h < top + plan.region)
            for j in range(wz):
                left = j * plan.factor + ch.off_w
                mask = in_h & (grid_w >= left) & (grid_w < left + plan.region)
                rows_per_color.setdefault(ch.color, []).append(mask.flatten().float() / plan.region ** 2)
                index_per_color.setdefault(ch.color, []).append((idx, i, j))
    out = torch.zeros(z.shape[0], colors, height * width)
    for color, rows in rows_per_color.items():
        a = torch.stack(rows).double()
        idx = torch.tensor(index_per_color[color])
        v = z[:, idx[:, 0], idx[:, 1], idx[:, 2]].double()  # [n, m]
        gram = a @ a.T + RIDGE * torch.eye(a.shape[0], dtype=a.dtype)
        out[:, color] = (torch.linalg.solve(gram, v.T).T @ a).float()
    return out.reshape(z.shape[0], colors, height, width)


def _smooth(image: torch.Tensor, size: int) -> torch.Tensor:
    n, c, h, w = image.shape
    pad = size // 2
    padded = F.pad(image.reshape(n * c, 1, h, w), (pad, size - 1 - pad, pad, size - 1 - pad),
                   mode="replicate")
    kernel = torch.full((1, 1, size, size), 1.0 / size ** 2)
    return F.conv2d(padded, kernel).reshape(n, c, h, w)

def _place(tiles: torch.Tensor, off_h: int, off_w: int, cells_h: int,
           cells_w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Put region tiles (already expanded to cells) onto the cell canvas."""
    n, m, th, tw = tiles.shape
    canvas = torch.zeros(n, m, cells_h, cells_w)
    valid = torch.zeros(n, m, cells_h, cells_w, dtype=torch.bool)
    src_h0, dst_h0 = max(0, -off_h), max(0, off_h)
    src_w0, dst_w0 = max(0, -off_w), max(0, off_w)
    hh = min(th - src_h0, cells_h - dst_h0)
    ww = min(tw - src_w0, cells_w - dst_w0)
    if hh > 0 and ww > 0:
        canvas[..., dst_h0:dst_h0 + hh, dst_w0:dst_w0 + ww] = tiles[..., src_h0:src_h0 + hh,
                                                                    src_w0:src_w0 + ww]
        valid[..., dst_h0:dst_h0 + hh, dst_w0:dst_w0 + ww] = True
    return canvas, valid

def _interpolate(total: torch.Tensor, count: torch.Tensor, factor: int, channels) -> torch.Tensor:
    """Fill pixels between exact point samples by normalised convolution with a
    tent kernel (bilinear on a regular lattice); uncovered borders stay 0."""
    offsets_h = sorted({c.off_h % factor for c in channels.values()})
    spacing = factor // max(1, len(offsets_h)) if factor > 1 else 1
    values = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
    mask = (count > 0).float()
    if spacing <= 1:
        return values
    ramp = 1 - torch.arange(-(spacing - 1), spacing).abs().float() / spacing
    kernel = (ramp[:, None] * ramp[None, :])[None, None]
    n, c, h, w = values.shape
    num = F.conv2d((values * mask).reshape(n * c, 1, h, w), kernel, padding=spacing - 1)
    den = F.conv2d(mask.reshape(n * c, 1, h, w), kernel, padding=spacing - 1)
    filled = torch.where(den > 1e-6, num / den.clamp(min=1e-6), torch.zeros_like(num))
    return filled.reshape(n, c, h, w)

def feature_map_shape(model: nn.Module, input_shape) -> tuple[int, ...]:
    """Shape of the conv feature map that the first FC layer flattens."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    captured: list[torch.Size] = []
    handle = linears[0].register_forward_pre_hook(lambda _m, inp: captured.append(inp[0].shape))
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    shape_hook = convs[-1]
    out_shapes: list[torch.Size] = []
    handle2 = shape_hook.register_forward_hook(lambda _m, _i, out: out_shapes.append(out.shape))
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape))
    finally:
        handle.remove()
        handle2.remove()
    c = out_shapes[0][1]
    flat = captured[0][1]
    side = int(round(math.sqrt(flat / c)))
    return (c, flat // (c * side) if side else 1, side)


def sampled_pixels(plan: ConvPlan, shape: tuple[int, int]) -> torch.Tensor:
    """Mask of the input pixels a point-sampling (stride-2, "modified") network reads
    exactly: where its reconstruction is exact rather than interpolated."""
    height, width = shape
    mask = torch.zeros(shape, dtype=torch.bool)
    for ch in plan.channels.values():
        rows = torch.arange(height // plan.factor + 1) * plan.factor + ch.off_h
        cols = torch.arange(width // plan.factor + 1) * plan.factor + ch.off_w
        rows = rows[(rows >= 0) & (rows < height)]
        cols = cols[(cols >= 0) & (cols < width)]
        mask[rows[:, None], cols[None, :]] = True
    return mask
