"""Random streams: independent across clients, reproducible for a seed."""
from __future__ import annotations

import torch

from gradleak.run import experiment
from gradleak.run.experiment import AttackRunSpec, run_attack
from gradleak.seeding import stream, stream_seed


def test_streams_differ_by_path_and_repeat_by_seed():
    seeds = {stream_seed(s, *path) for s in (0, 1, 2)
             for path in (("client", "target", 0), ("client", "other", 0, 0), ("client", "other", 0, 1))}
    assert len(seeds) == 9
    a, b = stream(0, "x", 1), stream(0, "x", 1)
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))


def test_secure_aggregation_clients_draw_independent_noise(monkeypatch):
    """Every client summed by secure aggregation adds its own noise draw (at seed 0
    the target and the first other client once shared one)."""
    noises = []
    real = experiment.compute_update

    def record(model, x, y, training, chain, generator, modality=None):
        noisy = real(model, x, y, training, chain, generator, modality=modality)
        clean = real(model, x, y, training, None, None, modality=modality)
        noises.append(noisy.flat() - clean.flat())
        return noisy

    monkeypatch.setattr(experiment, "compute_update", record)
    for seed in (0, 1):
        noises.clear()
        run_attack(AttackRunSpec(dataset="digits", model="mlp", attack="fc-analytic", batch_size=2,
                                 defenses=("noise:sigma=0.1", "secagg:clients=4"), seed=seed, lpips="none"))
        assert len(noises) == 4
        corr = torch.corrcoef(torch.stack(noises))
        off_diagonal = corr[~torch.eye(4, dtype=torch.bool)]
        # ~4.4k noise entries per client: independent draws correlate by |r| < 0.05
        assert off_diagonal.abs().max() < 0.05, corr
