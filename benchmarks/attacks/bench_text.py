"""TAG, LAMP and DAGER side by side on the `news` corpus and the default `gpt2` (2 blocks,
width 384), each undefended, under Gaussian noise on the update and under top-k, through
`run_attack` (the client's FedSGD step, the defense, the server's attack and the scoring a
study runs; seed 0, one CPU thread).

Per row: ROUGE-1/2, exact sequences and sequences re-identified among 1,000 train-split
windows (token overlap), and the row's seconds (the client's step, the attack and its
budget ladder, the scoring). Quick: batches 1 and 4; full: also 16. TAG and LAMP run at their
defaults (1000 steps): the quick run takes about 50 minutes on one core, batch 16 about 20
minutes per TAG or LAMP row; on a GPU (`device` "auto" picks it) minutes in all.
"""
from __future__ import annotations

import json
import sys
import time

import torch

from gradleak.run.experiment import AttackRunSpec, run_attack

ATTACKS = ("dager", "tag", "lamp")
DEFENSES = ("none", "noise:sigma=0.001", "topk:sparsity=0.95")


def _row(attack: str, defense: str, batch: int) -> dict:
    spec = AttackRunSpec(dataset="news", model="gpt2", attack=attack, batch_size=batch, seed=0, lpips="none",
                         defenses=() if defense == "none" else (defense,))
    start = time.perf_counter()
    result = run_attack(spec)
    m = result.metrics
    scores = ("rouge1", "rouge2", "exact_sequence_accuracy", "reid")
    row = {"attack": attack, "defense": defense, "batch": batch,
           **{k: round(m[k], 3) for k in scores if m.get(k) is not None},
           "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def run(quick: bool) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batches = (1, 4) if quick else (1, 4, 16)
        rows = [_row(a, d, b) for d in DEFENSES for b in batches for a in ATTACKS]
    finally:
        torch.set_num_threads(threads)
    return {"model": "gpt2 (2 x 384 x 6)", "seq_len": 16, "rows": rows,
            "papers": "TAG (Deng et al. 2021), LAMP (Balunovic et al. 2022): ROUGE well below 1 at batch > 1; "
                      "DAGER (Petrov et al. 2024): exact up to batch 128 on GPT-2"}
