"""The Flower example (examples/flower_audit) audited end to end.

Reports the wall time of the documented command's run (10 clients, 3 FedAvg
rounds, every applicable attack at the quick budget on two round-1 clients),
the largest difference between a captured update and gradleak's own simulation
of the same client, and the strongest attack's PSNR per audited client without
and with Flower's local DP (LocalDpMod, clip 1, ε = 50). `--quick` runs one
attack (Inverting Gradients) instead of every applicable one.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

APP = Path(__file__).resolve().parents[1] / "examples" / "flower_audit"


def _strongest_psnr(store) -> dict:
    from gradleak.store import ResultStore

    best: dict = {}
    with ResultStore(store, create=False) as s:
        for c in s.cells("attack"):
            key = f"round {c.labels['round']} client {c.labels['client']}"
            psnr = c.metrics.get("psnr")
            if psnr is not None and psnr > best.get(key, {}).get("psnr", float("-inf")):
                best[key] = {"psnr": round(psnr, 2), "ssim": round(c.metrics["ssim"], 3),
                             "attack": c.labels["attack_spec"]}
    return best


def run(quick: bool = False) -> dict:
    from gradleak.fl import compute_update
    from gradleak.flower import run_app

    torch.set_num_threads(1)
    attacks = ["ig:iterations=1000"] if quick else None
    out = {"setting": "examples/flower_audit: 10 clients, 3 rounds, 8 MNIST images per client, 2 local epochs "
                      "of SGD with momentum over a seeded shuffling DataLoader, round 1 audited on 2 clients",
           "attacks": attacks or "auto (quick budget)"}
    with tempfile.TemporaryDirectory() as tmp:
        plain = run_app(APP, out=Path(tmp) / "plain", attacks=attacks, lpips="none")
        noisy = run_app(APP, out=Path(tmp) / "dp", attacks=attacks, lpips="none",
                        run_config={"local-dp-epsilon": "50"})
        differences = []
        for c in plain.captured:
            from flower_audit.task import Net

            model = Net()
            model.load_state_dict(c.sent)
            simulated = compute_update(model, c.inputs, c.labels, c.training)
            differences.append(max(float((simulated.tensors[n] - c.update.tensors[n]).abs().max())
                                   for n in simulated.tensors))
        out.update({
            "wall_seconds": round(plain.seconds, 1),
            "wall_seconds_with_local_dp": round(noisy.seconds, 1),
            "captured_vs_simulated_max_abs_difference": max(differences),
            "strongest_psnr_without_dp": _strongest_psnr(plain.store),
            "strongest_psnr_with_local_dp": _strongest_psnr(noisy.store),
        })
    return out
