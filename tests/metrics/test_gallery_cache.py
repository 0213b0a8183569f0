"""A gallery's LPIPS features kept on disk (gradleak.metrics.gallery_cache) are read back
unchanged by a later Gallery instead of recomputed, under a key that follows the gallery's
bytes and the LPIPS weights; identical candidates are judged once, with the same verdict."""
from __future__ import annotations

import pytest
import torch

from gradleak.metrics import gallery_cache, reidentify
from gradleak.metrics.candidate_set import distinct_rows, judge_candidates
from gradleak.metrics.reidentify import Gallery


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADLEAK_CACHE", str(tmp_path))
    return tmp_path


def _images(n, seed, side=16):
    return torch.rand(n, 1, side, side, generator=torch.Generator().manual_seed(seed))


def _no_backbone(monkeypatch):
    def refuse(*_):
        raise AssertionError("the gallery's features were recomputed")

    monkeypatch.setattr(reidentify, "unit_features", refuse)


def test_a_later_gallery_reads_the_kept_features_instead_of_recomputing_them(cache, monkeypatch):
    inputs = _images(6, 0)
    features, norms = reidentify._gallery_lpips(Gallery(inputs, "first"), "alex")
    assert len(list((cache / "lpips-gallery").glob("*.safetensors"))) == 1
    _no_backbone(monkeypatch)
    again, again_norms = reidentify._gallery_lpips(Gallery(inputs.clone(), "second"), "alex")
    assert all(torch.equal(a, b) for a, b in zip(features + norms, again + again_norms))


def test_the_key_follows_the_gallery_and_the_weights(cache, monkeypatch):
    inputs = _images(4, 1)
    path = gallery_cache.kept_path(inputs, "alex")
    changed = inputs.clone()
    changed[2, 0, 5, 5] += 1e-6
    assert gallery_cache.kept_path(changed, "alex") != path
    assert gallery_cache.kept_path(inputs, "vgg") != path
    monkeypatch.setattr(gallery_cache, "weights_digest", lambda backbone: "other weights")
    assert gallery_cache.kept_path(inputs, "alex") != path


def test_a_damaged_file_is_recomputed_and_rewritten(cache):
    inputs = _images(5, 2)
    features, _ = reidentify._gallery_lpips(Gallery(inputs, "first"), "alex")
    path = gallery_cache.kept_path(inputs, "alex")
    path.write_bytes(b"not a safetensors file")
    assert gallery_cache.read_kept(inputs, "alex") is None
    again, _ = reidentify._gallery_lpips(Gallery(inputs, "second"), "alex")
    assert all(torch.equal(a, b) for a, b in zip(features, again))
    assert gallery_cache.read_kept(inputs, "alex") is not None


def test_repeated_candidates_are_judged_once_with_the_same_verdict(cache):
    originals, others = _images(6, 3), _images(40, 4)
    distinct = (originals[:4] + 0.3 * _images(4, 5)).clamp(0, 1)
    repeated = distinct[torch.tensor([0, 1, 1, 2, 3, 3, 3, 0])]
    first, inverse = distinct_rows(repeated)
    assert sorted(first.tolist()) == [0, 1, 3, 4]  # where each distinct candidate first occurs
    assert torch.equal(repeated[first][inverse], repeated)
    gallery = Gallery(others, "random")
    once = judge_candidates(originals, distinct, gallery, ("ssim", "lpips"))
    twice = judge_candidates(originals, repeated, gallery, ("ssim", "lpips"))
    assert once.ranks == twice.ranks and once.linkage == twice.linkage
