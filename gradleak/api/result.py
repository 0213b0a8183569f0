"""`AuditResult`: the attacks an audit ran and those it skipped, its verdict in words, and its
rows in the results store (`save`) and HTML report (`write_report`)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..fl.training_check import TrainingCheck
from ..leakage import Tolerance
from ..run.scenario.outputs import result_record
from ..run.scenario.spec import AttackRunResult
from .selection import SkippedAttack


@dataclass
class AuditResult:
    """The attacks that ran (with the CLI's metrics each) and those that were skipped."""

    runs: list[AttackRunResult]
    skipped: list[SkippedAttack]
    setting: dict = field(default_factory=dict)
    # for a captured update: whether the declared training reproduced it (audit_update)
    training_check: TrainingCheck | None = None
    # what the user accepts: the verdict's "holds" means every attack meets it
    tolerance: Tolerance = field(default_factory=Tolerance)

    def __repr__(self) -> str:
        s = self.setting
        return (f"AuditResult({len(self.runs)} attack run(s), {len(self.skipped)} skipped; "
                f"{s.get('model')} on {s.get('dataset')}, batch {s.get('batch_size')}, "
                f"defenses: {', '.join(s.get('defenses') or []) or 'none'})")

    def by_attack(self) -> dict[str, dict]:
        """Attack spec → its summary metrics."""
        return {r.spec.attack: r.metrics for r in self.runs}

    def verdicts(self) -> list[dict]:
        """The strongest-attack entries of `gradleak.analysis` for this audit's setting(s):
        verdict, verdict_text, grade, re-identification counts, ..."""
        from ..analysis import strongest_attacks

        return strongest_attacks(self.records(), self.tolerance)

    def summary(self) -> str:
        """The verdict in a few lines: the setting, the verdict in words, then one line per
        attack (PSNR, SSIM, re-identified, budget and how its ladder ended) and what was
        skipped."""
        s = self.setting
        lines = [f"{s.get('model')} on {s.get('dataset')}, batch {s.get('batch_size')}, "
                 f"{s.get('local_steps')} local step(s), defenses: {', '.join(s.get('defenses') or []) or 'none'}, "
                 f"threat model {s.get('threat')}, seed(s) {', '.join(map(str, self.seeds())) or '–'}"]
        for entry in self.verdicts():
            lines.append(f"verdict: {entry['verdict_text']}")
        for run in self.runs:
            lines.append("  " + run.summary())
        for skip in self.skipped:
            lines.append(f"  not run: {skip.attack}: {skip.reason}")
        if self.training_check is not None and self.training_check.confirmed is False:
            lines.append(f"  training not confirmed: {self.training_check.note}")
        return "\n".join(lines)

    def seeds(self) -> list[int]:
        return sorted({r.spec.seed for r in self.runs})

    def records(self) -> list:
        """The store rows this result is saved as (without images)."""
        from ..store import CellRecord
        from ..sweep import attack_labels, cell_key

        out = []
        for run in self.runs:
            spec = {**json.loads(json.dumps(run.spec.to_dict(), default=list)), **self._identity()}
            record = result_record(run, images=False)
            labels = {**attack_labels(run.spec), "tolerance": self.tolerance.to_text()}
            out.append(CellRecord(cell_key("attack", spec), "attack", "audit", spec, labels,
                                  record["metrics"], record["extras"], record["seconds"],
                                  modality=record.get("modality")))
        return out

    def strongest(self, metric: str = "mse") -> AttackRunResult | None:
        """The run with the best reconstruction by `metric` (lowest MSE/LPIPS, highest PSNR/SSIM/ASR)."""
        lower_better = metric in ("mse", "rmse", "lpips")
        scored = [r for r in self.runs if r.metrics.get(metric) is not None]
        if not scored:
            return None
        pick = min if lower_better else max
        return pick(scored, key=lambda r: r.metrics[metric])

    def to_json(self) -> dict:
        return {"setting": self.setting, "runs": [r.to_json() for r in self.runs],
                "skipped": [s.to_dict() for s in self.skipped]}

    def save(self, store_path: str | Path, sweep: str = "audit", labels: dict | None = None) -> int:
        """Write one store row per attack that ran and one per skipped attack;
        `labels` (e.g. round and client) are added to every row and its key.
        Returns the number of rows written (rows already present are kept)."""
        from ..store import CellRecord, ResultStore
        from ..sweep import attack_labels, cell_key, store_result_record

        extra = dict(labels or {})
        written = 0
        with ResultStore(store_path) as store:
            for run in self.runs:
                spec = {**json.loads(json.dumps(run.spec.to_dict(), default=list)), **self._identity(), **extra}
                row_labels = {**attack_labels(run.spec), "tolerance": self.tolerance.to_text(), **extra}
                written += store_result_record(store, sweep, "attack", spec, row_labels, result_record(run))
            for skip in self.skipped:
                spec = {"attack": skip.attack, "threat": self.setting.get("threat"), **self._scenario_labels(),
                        **self._identity(), **extra}
                row_labels = {"attack": skip.name, "attack_spec": skip.attack,
                              "reason": skip.reason, **self._scenario_labels(), **extra}
                record = CellRecord(cell_key("skipped", spec), "skipped", sweep, spec, row_labels,
                                    {}, {"reason": skip.reason}, 0.0)
                written += store.add_cell(record)
        return written

    def write_report(self, out: str | Path, store_path: str | Path | None = None) -> Path:
        """Save into `store_path` (default OUT/results.db) and write OUT/index.html."""
        from ..report import write_report

        out = Path(out)
        store_path = Path(store_path) if store_path is not None else out / "results.db"
        self.save(store_path)
        return Path(write_report(store_path, out, self.tolerance)["html"])

    def _identity(self) -> dict:
        return {k: self.setting[k] for k in ("model_digest", "data_digest") if k in self.setting}

    def _scenario_labels(self) -> dict:
        s = self.setting
        return {"dataset": s.get("dataset"), "model": s.get("model"), "batch_size": s.get("batch_size"),
                "local_steps": s.get("local_steps"), "seed": s.get("seed"),
                "defense": s.get("defense", "none"), "strength": s.get("strength", ""),
                "defenses": s.get("defenses", [])}
