"""Sweep files: the YAML grid parsed into cells, each keyed by a hash of its full spec.

Over 400 lines: one parser (`_SweepParser`) checks every key of a sweep file and names the file
and the key in its message.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GradleakError, InputFileError
from ..leakage import Tolerance, parse_tolerance
from ..options import MAX_SWEEP_CELLS, check_device, parse_chain, parse_spec, path_kind
from ..run.experiment import AttackRunSpec
from ..run.ladder import LADDER_DOUBLINGS
from .cells import attack_run_spec, utility_run_spec, utility_spec_type
from .labels import attack_labels, chain_labels, dataset_label, is_dataset_path

CELL_VERSION = 5  # bump when a cell's result would change for the same spec (5: L-BFGS by the Gram matrix)

_GRID_AXES = {"datasets": "dataset", "models": "model", "batch_sizes": "batch_size",
              "local_steps": "local_steps", "seeds": "seed"}
_GRID_KEYS = set(_GRID_AXES) | {"defenses", "attacks", "defaults"}
_TOP_KEYS = {"name", "description", "defaults", "grids", "utility", "tolerance", "samples"}
_SAMPLES_KEYS = {"rungs", "max_examples"}
_UTILITY_KEYS = {"options", "seeds", "max_loss", "precision", "max_seeds"}
_ATTACK_RUN_KEYS = {"threat", "knows"}


@dataclass(frozen=True)
class Cell:
    kind: str  # "attack" | "utility"
    spec: dict  # AttackRunSpec.to_dict() or the utility spec's fields
    labels: dict  # dataset, model, batch_size, local_steps, seed, defense, strength, attack, ...
    key: str = ""
    origin: str = field(default="", compare=False)  # where the sweep file asked for it: "grids[1]", "utility"

    def __post_init__(self):
        if not self.key:
            object.__setattr__(self, "key", cell_key(self.kind, self.spec))


@dataclass(frozen=True)
class SampleLadder:
    """How far the auditor may add examples to a setting whose verdict is still open (its
    attacks' examples cannot yet bound the rates within the tolerance, or a leak is
    borderline): up to `rungs` rounds of fresh examples, until each attack has been judged on
    `max_examples` (gradleak.sweep.samples)."""

    rungs: int = 3
    max_examples: int = 64


@dataclass(frozen=True)
class UtilityLadder:
    """How far the auditor may add utility seeds (gradleak.sweep.utility_ladder): until every
    defense's paired utility loss has a 95% interval of ± `precision` at most, or `max_seeds`
    seeds ran. `precision` None: no ladder (the listed seeds only)."""

    precision: float | None = None
    max_seeds: int = 8


@dataclass
class Sweep:
    name: str
    cells: list[Cell]
    source: str = ""
    tolerance: Tolerance = field(default_factory=Tolerance)
    samples: SampleLadder = field(default_factory=SampleLadder)
    utility_ladder: UtilityLadder = field(default_factory=UtilityLadder)

    @property
    def attack_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.kind == "attack"]

    @property
    def utility_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.kind == "utility"]


def cell_key(kind: str, spec: dict) -> str:
    text = json.dumps({"kind": kind, "spec": spec, "version": CELL_VERSION}, sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def setting_key(kind: str, spec: dict, apart: tuple[str, ...] = ("seed",)) -> str:
    """The cell's kind and spec without the fields `apart`: cells that differ only there share it
    (the same setting, checked once; the same cost per example)."""
    return kind + json.dumps({k: v for k, v in spec.items() if k not in apart}, sort_keys=True, default=list)


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file: UTF-8 text without NUL bytes, valid YAML, a valid grid."""
    path = Path(path)
    kind = path_kind(path, "sweep spec")
    if kind is None:
        raise InputFileError(f"sweep spec '{path}' not found")
    if kind != "file":
        raise InputFileError(f"sweep spec '{path}' is not a file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"sweep spec '{path}' cannot be read ({exc.strerror or exc})") from None
    if b"\x00" in data:
        raise InputFileError(f"sweep spec '{path}' holds NUL bytes: not a YAML text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"sweep spec '{path}' is not UTF-8 text (byte {exc.start})") from None
    return parse_sweep(text, str(path))


def parse_sweep(text: str, source: str = "<sweep>") -> Sweep:
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise InputFileError(f"sweep '{source}':{where} invalid YAML ({getattr(exc, 'problem', exc)})") from None
    except RecursionError:
        raise InputFileError(f"sweep '{source}': the YAML is nested too deeply") from None
    try:
        return _SweepParser(source).parse(doc)
    except RecursionError:  # a nested value that passed the YAML parser (e.g. deep options)
        raise InputFileError(f"sweep '{source}': a value is nested too deeply") from None


class _SweepParser:
    def __init__(self, source: str):
        self.source = source
        self.planned = 0  # attack cells of the grids read so far, before duplicates merge

    def fail(self, where: str, message: str):
        raise GradleakError(f"sweep '{self.source}': {where}: {message}")

    def mapping(self, value, where) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"expected a mapping, got {type(value).__name__}")
        return value

    def listing(self, value, where) -> list:
        if value is None:
            self.fail(where, "must not be empty")
        items = value if isinstance(value, list) else [value]
        if not items:
            self.fail(where, "must not be empty")
        return items

    def check_keys(self, doc: dict, allowed: set[str], where: str) -> None:
        for key in doc:
            if key not in allowed:
                self.fail(f"{where}{key}" if where else str(key),
                          f"unknown field; valid: {', '.join(sorted(allowed))}")

    def parse(self, doc) -> Sweep:
        if doc is None:
            raise GradleakError(f"sweep '{self.source}': the file is empty")
        doc = self.mapping(doc, "top level")
        self.check_keys(doc, _TOP_KEYS, "")
        if "grids" not in doc:
            self.fail("grids", "missing (a list of grids)")
        name = str(doc.get("name") or Path(self.source).stem)
        # a sweep's attacks climb the auditor's budget ladder unless the file says otherwise
        defaults = {"doublings": LADDER_DOUBLINGS,
                    **self.run_fields(self.mapping(doc.get("defaults") or {}, "defaults"), "defaults")}
        cells: dict[str, Cell] = {}
        for gi, grid in enumerate(self.listing(doc["grids"], "grids")):
            for cell in self.grid(grid, f"grids[{gi}]", defaults):
                cells.setdefault(cell.key, cell)
        if "utility" in doc and doc["utility"] is not None:
            for cell in self.utility(doc["utility"], list(cells.values())):
                cells.setdefault(cell.key, cell)
        self.validate(list(cells.values()))
        tolerance = self.tolerance(doc.get("tolerance"))
        budget = self.utility_budget(doc.get("utility"))
        for cell in cells.values():  # the verdict reads them back from the store
            cell.labels["tolerance"] = tolerance.to_text()
            if budget is not None:
                cell.labels["utility_budget"] = budget
        return Sweep(name, list(cells.values()), self.source, tolerance, self.samples(doc.get("samples")),
                     self.utility_ladder(doc.get("utility"), budget))

    def tolerance(self, value) -> Tolerance:
        try:
            return parse_tolerance(self.mapping(value, "tolerance") if value is not None else None)
        except GradleakError as exc:
            self.fail("tolerance", str(exc))
            raise

    def utility_budget(self, doc) -> float | None:
        """`utility.max_loss`: the utility loss the user accepts (test accuracy, as a fraction);
        the answer names what holds within it at 95% (gradleak.analysis.wording.answer)."""
        if not isinstance(doc, dict) or doc.get("max_loss") is None:
            return None
        value = doc["max_loss"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            self.fail("utility.max_loss", f"must be a number in (0, 1] (a fraction of test accuracy), got {value!r}")
        return float(value)

    def utility_ladder(self, doc, budget: float | None) -> UtilityLadder:
        """`utility.precision` (default: half the budget, so a loss is told from the budget) and
        `utility.max_seeds`."""
        if not isinstance(doc, dict):
            return UtilityLadder()
        precision = doc.get("precision", budget / 2 if budget is not None else None)
        if precision is not None and (isinstance(precision, bool) or not isinstance(precision, (int, float))
                                      or not 0 < precision <= 1):
            self.fail("utility.precision",
                      f"must be a number in (0, 1] (a fraction of test accuracy), got {precision!r}")
        max_seeds = doc.get("max_seeds", UtilityLadder.max_seeds)
        if isinstance(max_seeds, bool) or not isinstance(max_seeds, int) or not 2 <= max_seeds <= 100:
            self.fail("utility.max_seeds", f"must be an integer from 2 to 100, got {max_seeds!r}")
        return UtilityLadder(None if precision is None else float(precision), max_seeds)

    def samples(self, value) -> SampleLadder:
        if value is None:
            return SampleLadder()
        value = self.mapping(value, "samples")
        self.check_keys(value, _SAMPLES_KEYS, "samples.")
        for key, low, high in (("rungs", 0, 10), ("max_examples", 1, 100_000)):
            if key in value and (not isinstance(value[key], int) or isinstance(value[key], bool)
                                 or not low <= value[key] <= high):
                self.fail(f"samples.{key}", f"must be an integer from {low} to {high}, got {value[key]!r}")
        return SampleLadder(**value)

    def validate(self, cells: list[Cell]) -> None:
        """Every check a cell's run makes before it computes anything, for every cell, before the
        first one runs (`experiment.validate_run_spec`, `utility.utility_setup`): a typo in the
        last grid is one line now, not a failed cell hours later. Checks that do not depend on
        the seed run once."""
        from ..data import load_dataset

        loaded: dict = {}
        built: set = set()

        def load(spec):  # each dataset is read once for the whole sweep
            if spec not in loaded:
                loaded[spec] = load_dataset(spec)
            return loaded[spec]

        done: set[str] = set()
        for cell in cells:
            seedless = setting_key(cell.kind, cell.spec)
            if seedless in done:
                continue
            done.add(seedless)
            try:
                if cell.kind == "attack":
                    from ..run.experiment import validate_run_spec

                    validate_run_spec(attack_run_spec(cell.spec), load, built)
                else:
                    from ..utility import utility_setup

                    utility_setup(utility_run_spec(cell.spec), load)
            except GradleakError as exc:
                what = cell.labels.get("attack_spec") or "utility run"
                self.fail(cell.origin, f"{what} on {cell.labels.get('dataset')}/{cell.labels.get('model')}: {exc}")

    def run_fields(self, values: dict, where: str) -> dict:
        names = {f.name for f in dataclasses.fields(AttackRunSpec)}
        for key in values:
            if key not in names:
                self.fail(f"{where}.{key}", f"not an AttackRunSpec field; valid: {', '.join(sorted(names))}")
        if "attack" in values:
            self.fail(f"{where}.attack", "attacks are listed in each grid's `attacks`")
        if "device" in values:
            # the form only: cells may run on other machines (Ray); `gradleak sweep` checks
            # that a local run's device exists before it starts
            device = values["device"]
            if not isinstance(device, str):
                self.fail(f"{where}.device", f"must be auto, cpu or cuda[:N], got {device!r}")
            try:
                check_device(device, available=False)
            except GradleakError as exc:
                self.fail(f"{where}.device", str(exc))
        return dict(values)

    def grid(self, grid, where: str, defaults: dict) -> list[Cell]:
        grid = self.mapping(grid, where)
        self.check_keys(grid, _GRID_KEYS, f"{where}.")
        base = dict(defaults)
        base.update(self.run_fields(self.mapping(grid.get("defaults") or {}, f"{where}.defaults"),
                                    f"{where}.defaults"))
        axes: dict[str, list] = {}
        for axis, fieldname in _GRID_AXES.items():
            if axis in grid:
                values = self.listing(grid[axis], f"{where}.{axis}")
                for i, v in enumerate(values):
                    self.axis_value(fieldname, v, f"{where}.{axis}[{i}]")
                axes[fieldname] = values
            elif fieldname not in base and fieldname in ("dataset", "model"):
                self.fail(f"{where}.{axis}", "missing (and no default)")
        if "attacks" not in grid:
            self.fail(f"{where}.attacks", "missing")
        attacks = self.attacks(grid["attacks"], f"{where}.attacks")
        # a grid without defenses takes the defaults' chains (none when they name none)
        defenses = self.defense_chains(grid["defenses"], f"{where}.defenses") if "defenses" in grid else \
            self.defense_chains(base.get("defenses", ["none"]), f"{where}.defaults.defenses")
        size = len(defenses) * len(attacks)
        for values in axes.values():
            size *= len(values)
        self.planned += size
        if self.planned > MAX_SWEEP_CELLS:  # counted before any spec is built
            self.fail(where, f"the grids so far hold {self.planned:,} cells, more than the "
                             f"{MAX_SWEEP_CELLS:,} one sweep may run; split it into several sweeps")
        cells = []
        names = list(axes)
        for combo in itertools.product(*(axes[n] for n in names)):
            fields = dict(base)
            fields.update(zip(names, combo))
            for chain in defenses:
                for attack, overrides in attacks:
                    spec = self.build_spec({**fields, **overrides, "attack": attack, "defenses": tuple(chain)},
                                           where)
                    cells.append(Cell("attack", canonical_json(spec.to_dict()), attack_labels(spec), origin=where))
        return cells

    def axis_value(self, fieldname: str, value, where: str) -> None:
        if fieldname in ("dataset", "model"):
            if not isinstance(value, str) or not value.strip():
                self.fail(where, f"must be a {fieldname} name, got {value!r}")
            if fieldname == "model" and _is_user_model(value):
                return
            if fieldname == "dataset" and is_dataset_path(value):
                return
            registry = _registry(fieldname)
            name = parse_spec(value, fieldname).name
            if name not in registry:
                self.fail(where, f"unknown {fieldname} '{name}'; choose from: {', '.join(registry.names())}")
        else:
            minimum = 0 if fieldname == "seed" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                self.fail(where, f"must be an integer >= {minimum}, got {value!r}")

    def attacks(self, items, where: str) -> list[tuple[str, dict]]:
        """Attack entries → (`name:k=v`, per-attack AttackRunSpec fields such as
        `threat: malicious` for a malicious-server attack)."""
        out = []
        for i, item in enumerate(self.listing(items, where)):
            at = f"{where}[{i}]"
            overrides = {}
            if isinstance(item, dict):
                overrides = {k: v for k, v in item.items() if k in _ATTACK_RUN_KEYS}
                item = {k: v for k, v in item.items() if k not in _ATTACK_RUN_KEYS}
            out += [(text, overrides) for text in self.component(item, at, "attack", _ATTACK_RUN_KEYS)]
        return out

    def component(self, item, where: str, kind: str, extra_keys: set[str] = frozenset()) -> list[str]:
        """One entry → one or more `name:k=v` strings (list-valued options expand)."""
        if isinstance(item, str):
            texts = [item]
        elif isinstance(item, dict):
            self.check_keys(item, {"name", "options", *extra_keys}, f"{where}.")
            if not isinstance(item.get("name"), str):
                self.fail(f"{where}.name", f"missing {kind} name")
            options = self.mapping(item.get("options") or {}, f"{where}.options")
            keys = list(options)
            value_lists = [options[k] if isinstance(options[k], list) else [options[k]] for k in keys]
            for k, vs in zip(keys, value_lists):
                if not vs:
                    self.fail(f"{where}.options.{k}", "empty list")
            texts = [item["name"] + (":" + ",".join(f"{k}={_fmt(v)}" for k, v in zip(keys, combo)) if keys else "")
                     for combo in itertools.product(*value_lists)]
        else:
            self.fail(where, f"expected '{kind}:key=value' or {{name, options}}, got {item!r}")
        for text in texts:
            self.validate_component(text, where, kind)
        return [str(parse_spec(t, kind)) for t in texts]

    def validate_component(self, text: str, where: str, kind: str) -> None:
        try:
            if kind == "attack":
                from ..attacks import make_attack
                make_attack(text)
            else:
                from ..defenses import make_defense
                make_defense(text)
        except GradleakError as exc:
            self.fail(where, str(exc))

    def defense_chains(self, items, where: str) -> list[tuple[str, ...]]:
        chains: list[tuple[str, ...]] = []
        for i, item in enumerate(self.listing(items, where)):
            at = f"{where}[{i}]"
            if item is None or (isinstance(item, str) and item.strip().lower() == "none"):
                chains.append(())
            elif isinstance(item, list):
                parts = [self.component(p, f"{at}[{j}]", "defense") for j, p in enumerate(item)]
                chains += [tuple(c) for c in itertools.product(*parts)]
            else:
                chains += [(d,) for d in self.component(item, at, "defense")]
        return chains

    def build_spec(self, fields: dict, where: str) -> AttackRunSpec:
        fields = dict(fields)
        for key in ("defenses", "knows"):
            if key in fields and isinstance(fields[key], (list, str)):
                value = fields[key]
                fields[key] = tuple([value] if isinstance(value, str) else value)
        try:
            return AttackRunSpec(**fields)
        except GradleakError as exc:
            self.fail(where, str(exc))
        except TypeError as exc:
            self.fail(where, str(exc))

    def utility(self, doc, cells: list[Cell]) -> list[Cell]:
        doc = self.mapping(doc, "utility")
        self.check_keys(doc, _UTILITY_KEYS, "utility.")
        spec_type = utility_spec_type()
        if spec_type is None:
            self.fail("utility", "utility runs need gradleak.utility (run_utility), which is not installed")
        options = self.mapping(doc.get("options") or {}, "utility.options")
        valid = {f.name for f in dataclasses.fields(spec_type)}
        for key in options:
            if key not in valid:
                self.fail(f"utility.options.{key}",
                          f"not a {spec_type.__name__} field; valid: {', '.join(sorted(valid))}")
        seeds = self.listing(doc.get("seeds", [0]), "utility.seeds")
        for i, s in enumerate(seeds):
            self.axis_value("seed", s, f"utility.seeds[{i}]")
        # One utility run per (dataset, model, defenses) of the grids plus the undefended
        # baseline; FedAvg training itself (rounds, local steps, ...) comes from `options`,
        # the same for every run, so utility losses are comparable.
        scenarios = []
        for c in cells:
            s = c.spec
            scenarios.append((s["dataset"], s["model"], tuple(s["defenses"])))
            scenarios.append((s["dataset"], s["model"], ()))
        out = []
        for dataset, model, defenses in dict.fromkeys(scenarios):
            for seed in seeds:
                fields = {"dataset": dataset, "model": model, "defenses": defenses, "seed": seed}
                fields = {k: v for k, v in fields.items() if k in valid}
                fields.update(options)
                try:
                    spec = spec_type(**fields)
                except (GradleakError, TypeError, ValueError) as exc:
                    self.fail("utility.options", str(exc))
                spec_dict = canonical_json(dataclasses.asdict(spec))
                # `model` is the attacked architecture the utility is reported against;
                # `trained_model` what FedAvg trained, when utility.options names another one.
                labels = {"dataset": dataset_label(dataset), "model": model,
                          "trained_model": spec_dict.get("model", model),
                          **chain_labels(parse_chain(defenses)),  # the grid's (options may train others)
                          "defenses": list(defenses), "seed": seed}
                out.append(Cell("utility", spec_dict, labels, origin="utility"))
        return out


def _is_user_model(text: str) -> bool:
    from ..models.user import is_user_model_ref

    return is_user_model_ref(text)


def _registry(kind: str):
    if kind == "dataset":
        from ..data import DATASETS
        return DATASETS
    from ..models import MODELS
    return MODELS


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ";".join(map(_fmt, value))
    return str(value)


def canonical_json(value):
    """JSON-shaped copy (tuples → lists) so the hash is stable across processes."""
    return json.loads(json.dumps(value, default=list))

