"""The auditor's budget ladder.

The auditor holds the ground truth, so it can see whether more budget would change a
verdict: an iterative attack is scored at its own budget and after each doubling of it
(resuming, not restarting), and stops climbing once its verdict is decided — a leak on this
batch, or saturation (more budget stopped improving the reconstruction). The seconds the
attack spent and the seconds judging it (scoring against the originals and the gallery) are
kept apart.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

import torch

from ..attacks import Attack, AttackContext, Reconstruction
from ..metrics import score_batch
from ..metrics.reidentify import Gallery
from ..threat import Observation

# A doubling that raised the batch's PSNR (of its mean MSE; for other data the same dB of
# MSE) by at most this much, and re-identified or recognised no more examples, leaves the
# attack saturated.
SATURATION_MARGIN_DB = 0.5
# the same for token sequences, on the batch's mean ROUGE-1 (a word in 50 of the batch's)
SATURATION_MARGIN_ROUGE = 0.02
# On a batch of at least this many judged examples the judged measures decide saturation as
# rates: the mean linkage AUC (what a "holds" is decided by) must also have risen by at most
# SATURATION_MARGIN_LINKAGE (its null sd is 0.029 over 100 examples, 0.014 over 400), and the
# re-identified and recognizable counts by at most SATURATION_MARGIN_RATE of the examples (at a
# 300-image gallery's 0.66% chance, 400 examples re-identify 2.6 by chance, sd 1.6: a count that
# moves by one or two between doublings is that noise, not a gain). On fewer examples any rise
# in a count blocks saturation and the linkage is left out: it moves by chance more than a gain.
RATES_SATURATION_MIN_EXAMPLES = 100
SATURATION_MARGIN_LINKAGE = 0.02
SATURATION_MARGIN_RATE = 0.01
# The doublings sweeps, `gradleak.audit` and the Flower audit allow an attack by default.
LADDER_DOUBLINGS = 3
# A batch whose recognizable examples are this unlikely at the chance level ends its ladder
# as a leak (one batch, uncorrected: the verdict re-tests every example pooled, corrected).
RUNG_LEAK_P = 0.05


@dataclass
class Rung:
    """One rung of an attack's budget ladder, scored by the auditor."""

    iterations: int  # the attack's own count (all restarts together)
    budget: int | None  # iterations per restart this rung allowed
    seconds: float
    mse: float | None  # None for token sequences, which have no MSE
    psnr: float | None
    examples: int
    copies: int  # examples reconstructed exactly (the modality's copy criterion)
    identified: int | None  # examples re-identified among the gallery (None: no gallery)
    rouge1: float | None = None  # token sequences: mean ROUGE-1 (None for other data)
    recognizable: int | None = None  # re-identified and above the perceptual bar (None: no gallery)
    linkage: float | None = None  # mean linkage AUC (None: no gallery)
    judge_seconds: float = 0.0  # of `seconds`, those spent scoring this rung

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Climb:
    """The last rung's reconstruction, its scores and the reconstructions aligned to the
    originals, with the ladder as the store keeps it."""

    reconstruction: Reconstruction
    scores: list
    aligned: torch.Tensor
    ladder: dict


def climb_budget_ladder(attack: Attack, obs: Observation, x: torch.Tensor, y: torch.Tensor, ctx: AttackContext,
                        lpips: str, gallery: Gallery | None, doublings: int) -> Climb:
    """Attack one observation up the budget ladder: score each rung against (x, y) and stop
    at the first rung whose verdict is decided (`rung_decision`) or after `doublings`
    doublings."""
    started = time.perf_counter()
    if ctx.deadline is not None:
        # the scoring after the attack spends the same budget: the attack stops early enough to
        # leave it the time that scoring these examples takes
        ctx = replace(ctx, deadline=ctx.deadline - judging_seconds(obs, x, y, lpips, gallery))
    rungs: list[Rung] = []
    chance = None
    decision = None
    judging = 0.0
    out_of_time = False
    first = attack.budget()
    blind = attack.blind_to(obs.training) if obs.knows("local_training") else None
    for index, rec in enumerate(attack.rungs(obs, ctx)):
        if blind:
            rec.extras["training_blind"] = blind
        broken = int((~torch.isfinite(rec.inputs.detach().flatten(1)).all(1)).sum()) if rec.inputs.numel() else 0
        if broken:
            rec.extras["not_finite"] = (f"{broken} of {len(rec.inputs)} reconstruction(s) held NaN or infinite "
                                        "values: scored as not reconstructed")
        judge_start = time.perf_counter()
        scores, aligned = score_batch(x, y, rec.inputs, rec.labels, obs.modality, lpips, gallery=gallery,
                                      tokenizer=obs.tokenizer)
        judged = time.perf_counter() - judge_start
        judging += judged
        chance = scores[0].reid_chance if scores else None
        budget = first * 2 ** index if first else None
        rungs.append(score_rung(rec, scores, budget, time.perf_counter() - started, judged))
        analytic = not attack.iterative and not rec.trace
        if ctx.out_of_time():
            # the time budget ended this rung early, wherever the attack was: it decides nothing
            # (a rung cut short looks flat beside the last, which would read as saturated)
            out_of_time = True
            break
        decision = rung_decision(rungs, analytic, rec.converged, chance, attack.saturation_floor())
        if decision is not None or index >= doublings:
            break
    seconds = time.perf_counter() - started
    return Climb(rec, scores, aligned, {"rungs": [r.to_dict() for r in rungs],
                                        "decision": "out of time" if out_of_time else decision or "undecided",
                                        "saturated": decision is not None, "reid_chance": chance,
                                        "attack_seconds": round(seconds - judging, 3),
                                        "judge_seconds": round(judging, 3)})


JUDGE_PROBE = 8  # examples scored to time the scoring of a batch


def judging_seconds(obs: Observation, x: torch.Tensor, y: torch.Tensor, lpips: str, gallery: Gallery | None
                    ) -> float:
    """About how long scoring reconstructions of all of `x` takes: the first few examples scored
    as their own reconstructions (after one, which loads what the scorer loads once), scaled to
    the batch."""
    probe = min(len(x), JUDGE_PROBE)
    score_batch(x[:1], y[:1], x[:1], y[:1], obs.modality, lpips, gallery=gallery, tokenizer=obs.tokenizer)
    start = time.perf_counter()
    score_batch(x[:probe], y[:probe], x[:probe], y[:probe], obs.modality, lpips, gallery=gallery,
                tokenizer=obs.tokenizer)
    return (time.perf_counter() - start) * len(x) / max(probe, 1)


def score_rung(rec: Reconstruction, scores: list, budget: int | None, seconds: float,
               judge_seconds: float = 0.0) -> Rung:
    from ..metrics.image import psnr_from_mse

    errors = [getattr(s, "mse", None) for s in scores]
    mse = sum(errors) / len(errors) if errors and None not in errors else None
    judged = [s for s in scores if s.gallery_rank is not None]
    rouge1 = [getattr(s, "rouge1", None) for s in scores]
    recognised = [getattr(s, "recognizable", None) for s in judged]
    linkage = [getattr(s, "linkage", None) for s in judged]
    return Rung(iterations=int(rec.iterations), budget=budget, seconds=round(seconds, 3), mse=mse,
                psnr=psnr_from_mse(mse) if mse is not None and getattr(scores[0], "psnr", None) is not None else None,
                examples=len(scores), copies=sum(bool(s.success) for s in scores),
                identified=sum(bool(s.identified) for s in judged) if judged else None,
                rouge1=sum(rouge1) / len(rouge1) if rouge1 and None not in rouge1 else None,
                recognizable=sum(bool(r) for r in recognised) if judged and None not in recognised else None,
                linkage=sum(linkage) / len(linkage) if judged and None not in linkage else None,
                judge_seconds=round(judge_seconds, 3))


def rung_decision(rungs: list[Rung], analytic: bool, converged: bool | None, chance: float | None,
                  floor: int = 1) -> str | None:
    """How the ladder ends at its last rung, or None while undecided:
    'leak' — some example copied, or more examples recognizable than chance gives on this batch
    (binomial tail at most RUNG_LEAK_P);
    'analytic' — an attack whose result more budget cannot change;
    'stop rule' — the attack met its own stop rule (CPL's distance threshold);
    'saturated' — the last doubling raised neither PSNR by more than SATURATION_MARGIN_DB
    (for token sequences: the copies, nor ROUGE-1 by more than SATURATION_MARGIN_ROUGE) nor
    the number re-identified or recognizable — on a batch of at least
    RATES_SATURATION_MIN_EXAMPLES judged examples: neither rate by more than
    SATURATION_MARGIN_RATE nor the mean linkage AUC by more than SATURATION_MARGIN_LINKAGE —
    at a budget of at least `floor` iterations (the attack's `saturation_floor`). One rung of
    an iterative attack is never saturated."""
    last = rungs[-1]
    if last.copies or _recognised_beyond_chance(last, chance):
        return "leak"
    if analytic:
        return "analytic"
    if converged:
        return "stop rule"
    if len(rungs) < 2 or (last.budget or 0) < floor:
        return None
    before = rungs[-2]
    more_found = _judged_gain(before, last)
    if last.mse is None or before.mse is None:  # token sequences: copies, ROUGE-1 and re-identification
        gained = (last.copies > before.copies or more_found
                  or (last.rouge1 or 0.0) - (before.rouge1 or 0.0) > SATURATION_MARGIN_ROUGE)
        return None if gained else "saturated"
    gain_db = 10 * math.log10(max(before.mse, 1e-12) / max(last.mse, 1e-12))
    return "saturated" if gain_db <= SATURATION_MARGIN_DB and not more_found else None


def _judged_gain(before: Rung, last: Rung) -> bool:
    """Whether the last doubling found more than the one before by the judged measures
    (re-identified, recognizable; on large batches as rates, and the mean linkage AUC)."""
    large = last.examples >= RATES_SATURATION_MIN_EXAMPLES
    allowed = int(SATURATION_MARGIN_RATE * last.examples) if large else 0
    counts = ((last.identified or 0) - (before.identified or 0) > allowed
              or (last.recognizable or 0) - (before.recognizable or 0) > allowed)
    linkage = (large and last.linkage is not None and before.linkage is not None
               and last.linkage - before.linkage > SATURATION_MARGIN_LINKAGE)
    return counts or linkage


def _recognised_beyond_chance(rung: Rung, chance: float | None) -> bool:
    if not rung.recognizable or chance is None:
        return False
    from scipy.stats import binom

    return float(binom.sf(rung.recognizable - 1, rung.examples, min(1.0, chance))) <= RUNG_LEAK_P


def ladder_summary(ladders: list[dict], gallery: Gallery | None) -> dict:
    """A run's ladders (one per attacked batch) as the store keeps them: saturated when every
    batch's ladder ended decided (a leak on a batch decides that batch)."""
    decisions = [ladder["decision"] for ladder in ladders]
    return {"batches": ladders, "decision": "leak" if "leak" in decisions else
            ("undecided" if "undecided" in decisions else decisions[0] if decisions else "undecided"),
            "saturated": bool(ladders) and all(ladder["saturated"] for ladder in ladders),
            # the budget per restart the ladders ended at (the attack's own count when it has none)
            "iterations": max((ladder["rungs"][-1]["budget"] or ladder["rungs"][-1]["iterations"]
                               for ladder in ladders if ladder["rungs"]), default=0),
            "attack_seconds": round(sum(ladder.get("attack_seconds", 0.0) for ladder in ladders), 3),
            "judge_seconds": round(sum(ladder.get("judge_seconds", 0.0) for ladder in ladders), 3),
            "gallery": gallery.describe() if gallery is not None else None}


def convergence_summary(runs: list[Reconstruction]) -> dict:
    """Whether every batch's attack reported convergence, its final matching distance, its
    trace, and whether its matching distance was still falling at the end (the attacker's
    own view; the auditor's judgement of saturation is the ladder's)."""
    flags = [r.converged for r in runs if r.converged is not None]
    distances = [r.final_distance for r in runs if r.final_distance is not None]
    improving = [still_improving(r.trace) for r in runs]
    converged = all(flags) if flags else None
    return {"converged": converged,
            "final_distance": max(distances) if distances else None,
            "still_improving": any(v for v in improving if v is not None) if any(
                v is not None for v in improving) else None,
            "trace": [list(r.trace) for r in runs] if any(r.trace for r in runs) else [],
            "trace_iterations": [list(r.trace_iterations) for r in runs] if any(r.trace_iterations for r in runs)
            else [],
            "trace_seconds": [list(r.trace_seconds) for r in runs] if any(r.trace_seconds for r in runs) else []}


# The last tenth of an attack's iterations counts as "still improving" when it found a
# matching distance this much (relatively) below the best of the iterations before it.
IMPROVING_TAIL = 0.1
IMPROVING_GAIN = 0.01


def still_improving(trace: list[float], tail: float = IMPROVING_TAIL, gain: float = IMPROVING_GAIN
                    ) -> bool | None:
    """Whether an iterative attack was still lowering its matching distance when its
    budget ran out (None for a trace too short to tell, e.g. an analytic attack)."""
    values = [v for v in trace if math.isfinite(v)]
    if len(values) < 10:
        return None
    cut = max(1, int(len(values) * (1 - tail)))
    before, last = min(values[:cut]), min(values[cut:])
    return last < before * (1 - gain) if before > 0 else False
