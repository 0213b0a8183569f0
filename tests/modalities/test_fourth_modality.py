"""A fourth kind of data in one file: time-series frames (windows of T steps of F channels in
[-1, 1]), defined here, outside the package, and registered in MODALITIES. Nothing else is
edited, yet every piece of the pipeline that differs by data calls into it: the client's
augmentation, scoring and clamping, re-identification, the dataset options, an attack run
through the one run pipeline, what the store keeps, the report's gallery and words, and the
terminal and Flower lines."""
from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
from torch import nn

from gradleak.errors import GradleakError
from gradleak.modalities import MODALITIES, Modality, Score, modality, stored_modality


@dataclass(frozen=True)
class Frames(Modality):
    """Frames are scored as feature rows but kept in [-1, 1], reversed in time by a client's
    flip, and shown as lines of values."""

    def augmented(self, x: torch.Tensor, augment: tuple[str, ...], padding: int,
                  generator: torch.Generator) -> torch.Tensor:
        if "flip" not in augment:
            return x
        reversed_ = torch.rand(x.shape[0], generator=generator) < 0.5
        return torch.where(reversed_.view(-1, 1, 1), x.flip(1), x)

    def record(self, originals: torch.Tensor, reconstructions: torch.Tensor, per_example: list[dict],
               numeric: Callable[[dict], dict], pictures: bool) -> tuple[bytes | None, list[dict], dict]:
        grid, images, _ = super().record(originals, reconstructions, per_example, numeric, pictures)

        def line(window: torch.Tensor) -> str:
            return " ".join(f"{v:.2f}" for v in window.flatten().tolist())
        return grid, images, {"sequences": [{"index": i, "original": line(originals[i]),
                                             "recovered": line(reconstructions[i]), "exact": bool(s.get("success"))}
                                            for i, s in enumerate(per_example)]}

    def gallery_caption(self, metrics: dict, fmt: Callable[[Any, int], str]) -> str:
        return f"frames off by MSE {fmt(metrics.get('mse'), 3)}"

    def outcome_headline(self, metrics: dict) -> str | None:
        return f"frame MSE {metrics['mse']:.2g}" if metrics.get("mse") is not None else None


FRAMES = Frames("frames", scores=(Score("mse", "frame MSE", "", 3, ".3g"),), value_range=(-1.0, 1.0),
                augmentations=("flip",))
STEPS, CHANNELS, CLASSES = 6, 3, 4


@pytest.fixture
def frames():
    MODALITIES.register("frames", FRAMES)
    yield FRAMES
    MODALITIES.unregister("frames")


def _batch(count: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.rand((count, STEPS, CHANNELS), generator=generator) * 2 - 1, torch.arange(count) % CLASSES


def _model() -> nn.Module:
    """The user's own model of windows (the built-in ones read pictures, rows or tokens),
    checked to read frames as any model is."""
    from gradleak.models.user import check_model_fits

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(STEPS * CHANNELS, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    assert check_model_fits(model, (STEPS, CHANNELS), CLASSES, modality="frames") == CLASSES
    return model


def test_it_is_found_by_name_and_leaves_no_trace(frames):
    assert modality("frames") is frames and stored_modality("frames") is frames and "frames" in MODALITIES
    MODALITIES.unregister("frames")
    assert "frames" not in MODALITIES and stored_modality("frames") is modality("tabular")
    MODALITIES.register("frames", frames)
    with pytest.raises(GradleakError, match="built-in"):
        MODALITIES.unregister("image")


def test_scoring_clamps_into_its_range_and_reidentifies_by_its_distance(frames):
    from gradleak.metrics import score_batch, summarize
    from gradleak.metrics.reidentify import Gallery, reid_distances

    x, y = _batch()
    overshoot = x * 3  # every value beyond [-1, 1] is brought back before it is scored
    scores, aligned = score_batch(x, y, overshoot, y, "frames", lpips="none")
    assert torch.equal(aligned, frames.clamp(overshoot)) and aligned.abs().max() <= 1
    assert summarize(scores)["mse"] == pytest.approx(float((frames.clamp(overshoot) - x).pow(2).mean()))
    assert all(s.psnr is None and s.ssim is None for s in scores)  # no picture scores
    assert reid_distances("frames", (STEPS, CHANNELS), "alex") == ("l2",)
    gallery = Gallery(_batch(8)[0][2:], "held-out windows")
    scores, _ = score_batch(x, y, x.clone(), y, "frames", lpips="none", gallery=gallery)
    assert all(s.gallery_rank == 0 for s in scores)  # a copy re-identifies its original


def test_the_client_augments_it_its_own_way(frames):
    from gradleak.fl import TrainingSpec, compute_update

    x, y = _batch(4)
    training = TrainingSpec(lr=0.1, local_steps=2, local_batch_size=2, augment=("flip",))

    def update(name: str, seed: int):
        return compute_update(_model(), x, y, training, generator=torch.Generator().manual_seed(seed),
                              modality=name).flat()
    assert not torch.equal(update("frames", 0), update("frames", 1))  # reversed in time by the draws
    assert torch.equal(update("tabular", 0), update("tabular", 1))  # rows are never augmented
    with pytest.raises(GradleakError, match="crop only apply to images"):
        frames.check_dataset_options("sensors", {"crop": 4})


def test_an_attack_the_store_and_the_report_run_on_it(frames, tmp_path):
    from gradleak.attacks import ATTACKS, AttackContext
    from gradleak.fl import TrainingSpec, compute_update
    from gradleak.fl.training import scenario_fields
    from gradleak.flower.attacking import outcome_words
    from gradleak.modalities.tabular import TABULAR
    from gradleak.report import write_report
    from gradleak.run.experiment import attack_observations
    from gradleak.run.scenario.outputs import result_record, write_outputs
    from gradleak.run.scenario.spec import AttackRunSpec
    from gradleak.store import ResultStore
    from gradleak.sweep.run import store_result_record
    from gradleak.threat import make_threat_model, observe

    class FramesAnalytic(ATTACKS.get("fc-analytic")):  # an attack that declares it takes frames
        modalities = ("frames",)

    attack = FramesAnalytic()
    assert frames.refuses(attack) is None and TABULAR.refuses(attack) == "does not handle tabular data"
    x, y = _batch()
    net, training = _model(), TrainingSpec()
    update = compute_update(net, x, y, training, modality="frames")
    obs = observe(update, net, make_threat_model("honest"), input_shape=(STEPS, CHANNELS), num_classes=CLASSES,
                  training=training, batch_size=len(x), labels=y, defenses=[], modality="frames", inputs=x)
    spec = AttackRunSpec(dataset="sensors", model="windows", attack="fc-analytic", batch_size=len(x),
                         **scenario_fields(training), seed=0, threat="honest", lpips="none", device="cpu")
    result = attack_observations(spec, attack, [(obs, x, y)], None, AttackContext(seed=0).device,
                                 attack_seed=lambda seed, batch: seed)
    assert result.modality == "frames" and result.metrics["mse"] < 1e-6 and result.metrics["asr"] == 1.0
    assert result.metrics.get("psnr") is None
    assert outcome_words(SimpleNamespace(runs=[result], skipped=[]), "frames").startswith("frame MSE")
    assert result.summary().count("frame MSE") == 1

    record = result_record(result)
    assert record["grid_png"] is None and len(record["extras"]["sequences"]) == len(x)
    paths = write_outputs(result, tmp_path / "out")
    assert set(paths) == {"json"} and json.loads(paths["json"].read_text())["metrics"]["asr"] == 1.0

    labels = {"threat": "honest", "dataset": "sensors", "model": "windows", "batch_size": len(x), "local_steps": 1,
              "seed": 0, "defense": "none", "strength": "", "defenses": [], "attack": "fc-analytic",
              "attack_spec": "fc-analytic", "init": None}
    with ResultStore(tmp_path / "store.db") as store:
        assert store_result_record(store, "s", "attack", {"attack": "fc-analytic"}, labels, record)
    out = write_report(tmp_path / "store.db", tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert out["texts"] == 1 and out["grids"] == 0  # shown by the view frames chose, captioned its own way
    assert "frames off by MSE" in page and record["extras"]["sequences"][0]["original"].split()[0] in page
