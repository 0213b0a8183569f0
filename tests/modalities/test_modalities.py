"""Each modality says in one record how its rows are scored, shown, ranked and attacked."""
from __future__ import annotations

import pytest
import torch

from gradleak.data.modality import legacy_modality
from gradleak.metrics.reidentify import reid_distances
from gradleak.modalities import MODALITIES, modality, stored_modality


def _fmt(value, digits):
    return "–" if value is None else f"{value:.{digits}g}"


@pytest.mark.parametrize("name, metrics, words, line", [
    ("image", {"psnr": 21.345, "ssim": 0.712, "mse": 0.007}, "PSNR 21.3 dB · SSIM 0.71", "PSNR 21.3 dB  SSIM 0.71"),
    ("tabular", {"mse": 0.01234}, "MSE 0.0123", "MSE 0.0123"),
    ("text", {"rouge1": 0.8, "rouge2": 0.55}, "ROUGE-1 0.8 · ROUGE-2 0.55", "ROUGE-1 0.80  ROUGE-2 0.55"),
])
def test_a_row_is_shown_in_its_own_scores(name, metrics, words, line):
    kind = modality(name)
    assert kind.score_words(metrics, _fmt) == words
    assert kind.score_line(metrics) == line
    assert kind.score_line({}) is None  # no headline: the caller says so


def test_the_better_reconstruction_ranks_first_by_the_data_own_rule():
    image, text = modality("image"), modality("text")
    assert image.rank({"mse": 0.01, "psnr": 20.0}) < image.rank({"mse": 0.02, "psnr": 17.0})
    assert image.rank({"mse": 0.01, "psnr": 20.0}) < image.rank({"mse": None})  # a missing score ranks last
    assert text.rank({"rouge1": 0.9}) < text.rank({"rouge1": 0.2}) < text.rank({})


def test_only_pictures_are_clamped_into_their_range():
    x = torch.tensor([-0.5, 0.5, 1.5])
    assert modality("image").clamp(x).tolist() == [0.0, 0.5, 1.0]
    assert torch.equal(modality("tabular").clamp(x), x) and torch.equal(modality("text").clamp(x), x)


def test_reidentification_uses_the_modality_distance():
    assert reid_distances("tabular", (8,), "alex") == ("l2",)
    assert reid_distances("text", (16,), "alex") == ("tokens",)
    assert reid_distances("image", (3, 32, 32), "none") == ("ssim",)
    assert reid_distances("image", (3, 32, 32), "alex") == ("ssim", "lpips")


def test_the_legacy_rule_reads_what_an_old_row_holds():
    assert legacy_modality({"mse": 0.1}, has_sequences=False, has_grid=True) == "image"
    assert legacy_modality({"psnr": 10.0}, has_sequences=False, has_grid=False) == "image"
    assert legacy_modality({}, has_sequences=True, has_grid=False) == "text"
    assert legacy_modality({"mse": 0.1}, has_sequences=False, has_grid=False) == "tabular"
    assert legacy_modality({}, has_sequences=False, has_grid=False) is None
    assert stored_modality(None) is MODALITIES.get("tabular") and stored_modality("text") is MODALITIES.get("text")


@pytest.mark.parametrize("name, row, line", [
    ("image", {"psnr": 21.34, "ssim": 0.712, "mse": 0.007}, "PSNR 21.3 dB  SSIM 0.71"),
    ("text", {"rouge1": 0.8, "rouge2": 0.55, "asr": 0.5}, "ROUGE-1 0.80  ROUGE-2 0.55  exact 50%"),
    ("tabular", {"mse": 0.01234}, "MSE 0.0123"),
    ("tabular", {"mse": None}, "no score"),
])
def test_a_federation_round_is_printed_in_its_data_scores(name, row, line):
    from gradleak.commands.flower import score_words_of

    assert score_words_of(row, modality(name)) == line


@pytest.mark.parametrize("name, metrics, words", [
    ("image", {"psnr": 21.34, "asr": 0.5, "reid": 0.25}, "PSNR 21.3 dB, 2 of 4 copied, 1 re-identified"),
    ("text", {"rouge1": 0.8, "asr": 0.25}, "ROUGE-1 0.80, 1 of 4 copied"),
    ("tabular", {"mse": 0.1, "asr": 0.0}, "0 of 4 copied"),
])
def test_a_flower_attack_is_summed_up_in_its_data_headline(name, metrics, words):
    from types import SimpleNamespace

    from gradleak.flower.attacking import outcome_words

    run = SimpleNamespace(metrics=metrics, per_example=[{}] * 4)
    assert outcome_words(SimpleNamespace(runs=[run], skipped=[]), name) == words
