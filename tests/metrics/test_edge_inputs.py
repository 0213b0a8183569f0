"""Edge inputs that are valid give results, not crashes: a flat start, an attack that
returns NaN, images one pixel tall."""
from __future__ import annotations

import math
import struct

import numpy as np
import torch

from gradleak.run.experiment import AttackRunSpec, run_attack


def test_rog_sign_from_a_flat_start_equalises_nothing_and_scores():
    # one step from a gray image leaves every channel (nearly) flat: skimage cannot build a
    # 256-bin histogram on it, so the channel is kept as it is
    result = run_attack(AttackRunSpec(dataset="mnist", model="lenet", attack="rog-sign:init=gray,iterations=1",
                                      lpips="none"))
    assert math.isfinite(result.metrics["mse"]) and result.metrics["matched"] == 1.0


def test_reconstructions_that_are_not_finite_are_scored_as_not_reconstructed():
    from gradleak.metrics import score_batch

    x = torch.rand(3, 1, 8, 8)
    recon = x.clone()
    recon[1] = float("nan")
    scores, aligned = score_batch(x, torch.arange(3), recon, None, lpips="none", modality="image")
    assert [s.matched for s in scores] == [True, False, True]
    assert scores[1].mse == float(x[1].pow(2).mean()) and not aligned[1].any()
    # an attack on an update a defense zeroed entirely: CPA divides by nothing
    result = run_attack(AttackRunSpec(dataset="mnist", model="lenet", attack="cpa", defenses=("prune:ratio=1",),
                                      lpips="none"))
    assert result.metrics["matched"] == 0.0 and result.metrics["reid"] == 0.0
    assert "held NaN or infinite values" in result.extras["not_finite"][0]


def test_images_one_pixel_tall_are_scored(tmp_path):
    from gradleak.metrics.image import ssim

    strip = torch.rand(2, 1, 1, 2000)
    values = ssim(strip, strip)
    assert torch.allclose(values, torch.ones(2))  # the window runs along the long side only
    folder = tmp_path / "idx"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split in ("t10k", "train"):
        for kind, magic, array in (("images-idx3", 0x803, rng.integers(0, 255, (12, 1, 300))),
                                   ("labels-idx1", 0x801, rng.integers(0, 10, 12))):
            header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
            (folder / f"{split}-{kind}-ubyte").write_bytes(header + array.astype(np.uint8).tobytes())
    result = run_attack(AttackRunSpec(dataset=f"mnist-idx:path={folder}", model="mlp", attack="fc-analytic"))
    assert math.isfinite(result.metrics["ssim"]) and result.metrics["psnr"] > 30  # analytic: an exact copy
    assert result.metrics["gallery"] == 11  # every example not attacked; SSIM only (LPIPS needs 16 px a side)
    assert result.metrics["reid_chance"] == 1 / 12


def test_an_unknown_flag_is_named_once(capsys):
    from gradleak.cli import main

    code = main(["attack", "--dataset", "mnist", "--model", "lenet", "--attack", "dlg", "--bogus"])
    assert code == 2
    assert capsys.readouterr().err == "gradleak: error: unrecognized arguments: --bogus\n"
    assert main(["--bogus"]) == 2
    assert capsys.readouterr().err.startswith("gradleak: error: the following arguments are required")
