"""The Flower example (examples/flower_audit) audited end to end.

Without `--quick`: the example as configured (20 clients, each training LeNet-5 on 400
examples of its Dirichlet(0.5) share of MNIST for one epoch of batch-32 SGD with momentum,
3 FedAvg rounds, rounds 1 and 3 audited on two clients each under the honest and the
malicious threat model): wall time of the documented command, each round's verdict per
threat model, and what each attack recovered on each audited client (PSNR, re-identified,
exact copies). With `--quick`: the small configuration the tests run (10 clients of 8
examples, the sigmoid CNN, 2 local epochs), Inverting Gradients on round 1's two clients,
without and with Flower's local DP (LocalDpMod, clip 1, ε = 50). Both report the largest
difference between a captured update and gradleak's own simulation of the same client.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

APP = Path(__file__).resolve().parents[2] / "examples" / "flower_audit"
SMALL = {"model": "sigmoid-cnn", "examples-per-client": "8", "local-epochs": "2"}


def _attack_rows(store) -> list[dict]:
    from gradleak.store import ResultStore

    rows = []
    with ResultStore(store, create=False) as s:
        for c in s.cells("attack"):
            m = c.metrics
            rows.append({"round": c.labels["round"], "client": c.labels["client"], "threat": c.labels.get("threat"),
                         "attack": c.labels["attack_spec"], "psnr": round(m["psnr"], 2),
                         "reid": m.get("reid"), "copied": m.get("asr"), "examples": c.labels.get("batch_size"),
                         "seconds": round(c.seconds, 1)})
    return sorted(rows, key=lambda r: (r["round"], r["client"], r["attack"]))


def _verdicts(store) -> dict:
    from gradleak.analysis import strongest_attacks
    from gradleak.report import verdict_in_words
    from gradleak.store import ResultStore

    with ResultStore(store, create=False) as s:
        return {title: lines for title, lines in verdict_in_words(strongest_attacks(s.cells()))}


def _largest_difference(run) -> float:
    from gradleak.fl import compute_update

    differences = []
    for c in run.captured:
        simulated = compute_update(c.model, c.inputs, c.labels, c.training)
        differences.append(max(float((simulated.tensors[n] - c.update.tensors[n]).abs().max())
                               for n in simulated.tensors))
    return max(differences)


def run(quick: bool = False) -> dict:
    from gradleak.flower import run_app

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if not quick:
            full = run_app(APP, out=Path(tmp) / "full", lpips="none")
            return {"setting": "examples/flower_audit as configured: 20 clients, 400 MNIST examples of each one's "
                               "Dirichlet(0.5) share, LeNet-5, 1 local epoch of batch-32 SGD with momentum 0.9, "
                               "3 rounds; rounds 1 and 3 audited on 2 clients each, honest and malicious",
                    "wall_seconds": round(full.seconds, 1), "attack_phase": full.attacks,
                    "captured_vs_simulated_max_abs_difference": _largest_difference(full),
                    "verdicts": _verdicts(full.store), "attacks": _attack_rows(full.store)}
        attacks = ["ig:iterations=1000"]
        plain = run_app(APP, out=Path(tmp) / "plain", attacks=attacks, lpips="none", run_config=SMALL,
                        num_supernodes=10, rounds=(1,))
        noisy = run_app(APP, out=Path(tmp) / "dp", attacks=attacks, lpips="none",
                        run_config={**SMALL, "local-dp-epsilon": "50"}, num_supernodes=10, rounds=(1,))
        return {"setting": "examples/flower_audit, small configuration: 10 clients, 8 MNIST images per client, "
                           "sigmoid CNN, 2 local epochs of SGD with momentum over a seeded shuffling DataLoader, "
                           "round 1 audited on 2 clients", "attacks": attacks,
                "wall_seconds": round(plain.seconds, 1), "wall_seconds_with_local_dp": round(noisy.seconds, 1),
                "captured_vs_simulated_max_abs_difference": _largest_difference(plain),
                "without_dp": _attack_rows(plain.store), "with_local_dp": _attack_rows(noisy.store)}
