"""A structure walk of `gradleak.audit`: where the `model` and `data` parameters travel.

`python -m benchmarks structure [--root DIR] [--quick]` runs `gradleak.audit` twice on a tiny
real case (MNIST, batch 1, DLG for 2 iterations): once with references (`model="lenet"`,
`data="mnist"`), once with objects (the user's own `nn.Module` and `(inputs, labels)` tensors),
under `sys.setprofile`, and follows the two parameters through the call stack.

Definitions (docs/architecture.md gives the measured numbers):

- tracked values: the `model` and `data` arguments as passed (a reference string, built here
  so that no interned literal elsewhere shares its identity; a module; a tuple of tensors and
  its elements), and every value a step returns that is a `nn.Module`, a `Dataset`, a string
  already tracked, or a tuple / list holding one (what was resolved from them), by identity.
- step: a call into a function defined under `<root>/gradleak` that receives a tracked value as
  an argument (directly, or as an element of a tuple, list or dict argument). A method called
  *on* a tracked object (`self` is the tracked value: `dataset.subset`, `model.forward`) uses the
  object where it is; it is not a step. Copies the pipeline makes (`copy.deepcopy`) are new
  objects and are not followed: the walk is about how far the user's references and what was
  resolved from them travel, not about the simulated training.
- room: the module (file) the step's function lives in; stay: a maximal run of consecutive
  steps in one room; floor: the layer rank of the step's top-level package in
  tests/test_layout.py's RANKS (api 17 at the top, data 3 and models 4 near the bottom).
- climb: a step whose floor is above the floor of the step before it (in call order; a return
  is not a step). A walk that resolves once and then only hands objects down climbs once, from
  the resolving floor back up to where the pipeline starts; each further climb is a return to
  a higher floor to name, resolve or check the same value again.
- entries: the stays in one room (or one package: `api/*` counts the stays in any `api` file).
- two counts per walk: `flow` leaves out the steps into the utilities ranked below `data`
  (options, registry, errors: a `parse_spec` look-up is a call every floor makes, not a floor
  the data flows through); `all_steps` keeps them.
- each walk follows both parameters together, and (`alone`) each parameter by itself, as the
  issue that asked for the walk followed `model`: following both interleaves the data's
  look-ups with the model's, which adds climbs between the two values that neither makes.

The Flower guard's walk (`flower_guard`) follows the `context` that Flower hands
`FlowerGuard.client_mod` through one guarded train call: a ClientApp with the guard as its mod,
driven in-process with Flower messages as tests/guard/test_guard_flower.py drives it (a
64-16-3 MLP, one example, one SGD step, the guard's default `start = "bottom"`, ladder
`noise:sigma=1`, attack `fc-analytic`, its log in a temporary folder). Round 1 runs unwalked, so that round 2,
the walked call, starts from the guard's memory in `context.state`; it checks rung 0 (fc-analytic copies the
example) and rung 1 (within tolerance). Its rules differ from the audit's where a context is
not a model:

- tracked values: the context and the records it holds (`state`, `run_config`,
  `node_config`), and every value returned by a call that received a tracked value (derived
  from it: the guard's config, the client's training, the app's model and examples, the update,
  the guard's memory), with the items of a returned tuple, list or dict and the fields of a
  returned dataclass, and the object an `__init__` step builds; numbers, strings and None are not
  followed (they have no identity of their own). Calls into the app's own functions (here,
  this file) pass values on but are not steps.
- the walk stops at `api/captured.py:audit_update` (the step is counted, what it calls is not):
  attacking one update is the audit's pipeline, whose walk is the `model` walk above.
- `context` follows the context alone; `context and message` adds the message and its content
  as roots (the arrays the server sent, the round).

The report holds, per walk, the steps, stays, rooms, distinct floors, climbs (with the
(from, to) room pairs), entries of api and experiment, and the ten largest modules of
`<root>/gradleak` by lines. `--root DIR` walks another checkout (e.g. an older commit exported
with `git archive SHA | tar -x -C DIR`); its gradleak is imported instead of this one.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def _ranks(root: Path) -> dict[str, int]:
    """RANKS of this checkout's tests/test_layout.py, with the walked checkout's own for names
    this one no longer has (so that both walks are measured on one scale)."""
    ranks: dict[str, int] = {}
    for layout in (root / "tests" / "test_layout.py", HERE / "tests" / "test_layout.py"):
        if not layout.exists():
            continue
        for node in ast.walk(ast.parse(layout.read_text())):
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "RANKS":
                ranks.update(ast.literal_eval(node.value))
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "RANKS" for t in node.targets):
                ranks.update(ast.literal_eval(node.value))
    return ranks


def largest_modules(package: Path, count: int = 10) -> list[tuple[str, int]]:
    sizes = [(str(p.relative_to(package.parent)), len(p.read_text().splitlines())) for p in package.rglob("*.py")]
    return sorted(sizes, key=lambda s: -s[1])[:count]



def tracked_arguments(frame, hits) -> list[str]:
    """The names of the arguments of `frame`'s call (positional, keyword-only, *args, **kwargs;
    not `self`/`cls`) whose values `hits` recognises as tracked."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:count])
    if code.co_flags & 0x04:  # *args
        names.append(code.co_varnames[count])
        count += 1
    if code.co_flags & 0x08:  # **kwargs
        names.append(code.co_varnames[count])
    local = frame.f_locals
    first = names[0] if names and names[0] in ("self", "cls") else None
    return [n for n in names if n != first and n in local and hits(local[n])]

class Walk:
    """Follows the tracked values through the calls into `package` (see the module docstring)."""

    def __init__(self, package: Path, ranks: dict[str, int], roots: dict[int, object]):
        self.prefix = str(package) + "/"
        self.ranks = ranks
        self.tracked: dict[int, object] = dict(roots)  # id -> object, kept alive so ids stay unique
        self.open: dict[int, int] = {}  # id(frame) of a step -> its index in steps
        self.steps: list[dict] = []
        self.stack: list[int] = []  # the open steps, innermost last

    def _room(self, filename: str) -> str:
        return filename[len(self.prefix):]

    def _hits(self, value) -> bool:
        if id(value) in self.tracked:
            return True
        if isinstance(value, (tuple, list)):
            return any(id(v) in self.tracked for v in value)
        if isinstance(value, dict):
            return any(id(v) in self.tracked for v in value.values())
        return False

    def _follow(self, value) -> None:
        import torch
        from torch import nn

        def resolved(v) -> bool:
            return isinstance(v, nn.Module) or (hasattr(v, "inputs") and hasattr(v, "labels")
                                                and isinstance(getattr(v, "inputs"), torch.Tensor))

        for v in (value if isinstance(value, (tuple, list)) else (value,)):
            if resolved(v):
                self.tracked[id(v)] = v
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                held = [getattr(v, f.name) for f in dataclasses.fields(v)]
                held = [h for h in held if resolved(h) or id(h) in self.tracked]
                for h in held:
                    self.tracked[id(h)] = h
                if held:  # a record of what was resolved (data.references.ResolvedData)
                    self.tracked[id(v)] = v

    def profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if not code.co_filename.startswith(self.prefix):
                return
            hits = tracked_arguments(frame, self._hits)
            if not hits:
                return
            room = self._room(code.co_filename)
            top = room.split("/")[0].removesuffix(".py")
            parent = self.stack[-1] if self.stack else None
            self.open[id(frame)] = len(self.steps)
            self.stack.append(len(self.steps))
            self.steps.append({"room": room, "function": code.co_name, "floor": self.ranks.get(top),
                               "arguments": hits, "parent": parent})
        elif event == "return" and id(frame) in self.open:
            del self.open[id(frame)]
            self.stack.pop()
            self._follow(arg)


def summarize(steps: list[dict]) -> dict:
    stays: list[dict] = []
    for step in steps:
        if stays and stays[-1]["room"] == step["room"]:
            stays[-1]["steps"] += 1
        else:
            stays.append({"room": step["room"], "floor": step["floor"], "steps": 1})
    climbs = [(a["room"], b["room"]) for a, b in zip(steps, steps[1:])
              if a["floor"] is not None and b["floor"] is not None and b["floor"] > a["floor"]]

    def entries(match) -> int:
        return sum(1 for s in stays if match(s["room"]))

    return {
        "steps": len(steps), "stays": len(stays), "rooms": len({s["room"] for s in steps}),
        "floors": len({s["floor"] for s in steps}), "climbs": len(climbs),
        "climb_pairs": [f"{a} -> {b}" for a, b in climbs],
        "api_entries": entries(lambda r: r == "api.py" or r.startswith("api/")),
        "api_entries_by_file": {r: entries(lambda x, r=r: x == r)
                                for r in sorted({s["room"] for s in stays if s["room"].startswith("api")})},
        "experiment_entries": entries(lambda r: r in ("experiment.py", "run/experiment.py")),
        "walk": [f"{s['room']} (floor {s['floor']}, {s['steps']} step{'s' if s['steps'] > 1 else ''})" for s in stays],
    }


def _walk(package: Path, ranks: dict[str, int], model, data, **options) -> dict:
    """The joint walk of both parameters, then each parameter followed alone (`model`, `data`:
    the issue's own measure followed `model` through `audit`)."""
    import gradleak

    def roots(*values) -> dict[int, object]:
        out: dict[int, object] = {}
        for value in values:
            out[id(value)] = value
            if isinstance(value, tuple):
                out.update({id(v): v for v in value})
        return out

    def walked(tracked: dict[int, object]) -> list[dict]:
        walk = Walk(package, ranks, tracked)
        sys.setprofile(walk.profile)
        try:
            gradleak.audit(model, data, **options)
        finally:
            sys.setprofile(None)
        return walk.steps

    lowest = ranks["data"]

    def counts(steps: list[dict]) -> dict:
        return {"flow": summarize([s for s in steps if s["floor"] is None or s["floor"] >= lowest]),
                "all_steps": summarize(steps)}

    out = counts(walked(roots(model, data)))
    out["alone"] = {name: {k: {key: v[key] for key in ("steps", "stays", "rooms", "climbs", "climb_pairs",
                                                        "api_entries", "experiment_entries")}
                           for k, v in counts(walked(roots(value))).items()}
                    for name, value in (("model", model), ("data", data))}
    return out


class DerivedWalk(Walk):
    """The Flower guard's walk: follows every value derived from the roots (the module docstring)."""

    def __init__(self, package: Path, ranks: dict[str, int], roots: dict[int, object], app_files: set[str],
                 boundary: tuple[str, str]):
        super().__init__(package, ranks, roots)
        self.app_files = app_files
        self.boundary = boundary
        self.inside: int | None = None  # id(frame) of the boundary's call while it runs

    def _track(self, value, depth: int = 0) -> None:
        from torch.nn import Module

        plain = (type(None), bool, int, float, complex, str, bytes, type)  # no identity of their own
        if isinstance(value, plain) or id(value) in self.tracked or callable(value) and not isinstance(value, Module):
            return
        self.tracked[id(value)] = value
        if depth > 1:
            return
        if isinstance(value, (tuple, list)):
            for v in value:
                self._track(v, depth + 1)
        elif isinstance(value, dict):
            for v in value.values():
                self._track(v, depth + 1)
        elif dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                self._track(getattr(value, f.name), depth + 1)

    def profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            in_package = code.co_filename.startswith(self.prefix)
            if self.inside is not None or not (in_package or code.co_filename in self.app_files):
                return
            hits = tracked_arguments(frame, self._hits)
            if not hits:
                return
            self.open[id(frame)] = -1  # the app's own function: its result is followed, it is no step
            if not in_package:
                return
            room = self._room(code.co_filename)
            top = room.split("/")[0].removesuffix(".py")
            self.open[id(frame)] = len(self.steps)
            self.steps.append({"room": room, "function": code.co_name, "floor": self.ranks.get(top),
                               "arguments": hits, "parent": None})
            if (room, code.co_name) == self.boundary:
                self.inside = id(frame)
        elif event == "return" and id(frame) in self.open:
            del self.open[id(frame)]
            if self.inside == id(frame):
                self.inside = None
            self._track(arg)
            if frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
                self._track(frame.f_locals["self"])


def _guard_app():
    """A ClientApp whose train function takes one SGD step on one example, the guard its mod."""
    import torch
    import torch.nn.functional as F
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from torch import nn

    from gradleak.fl import TrainingSpec
    from gradleak.flower.guard import FlowerGuard
    from gradleak.guard import GuardConfig

    def model_fn() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 3))

    def examples(context, msg):
        return torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([2])

    guard = FlowerGuard(model_fn=model_fn, examples=examples, training=lambda context, round_: TrainingSpec(lr=0.1),
                        config=GuardConfig(ladder=["noise:sigma=1"], attacks=["fc-analytic"], log=None))
    app = ClientApp(mods=[guard.client_mod])

    @app.train()
    def train(msg, context):
        model = model_fn()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        F.cross_entropy(model(examples(context, msg)[0]), examples(context, msg)[1]).backward()
        optimizer.step()
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    return app, model_fn


def guard_walk(package: Path, ranks: dict[str, int]) -> dict:
    """The Flower guard's walk (the module docstring), `context` alone and with its message; the
    guard's log goes to a temporary folder, not the working directory."""
    import os
    import tempfile

    from gradleak.flower.guard import LOG_ENV

    before = os.environ.get(LOG_ENV)
    with tempfile.TemporaryDirectory() as folder:
        os.environ[LOG_ENV] = os.path.join(folder, "guard.jsonl")
        try:
            return _guard_walk(package, ranks)
        finally:
            if before is None:
                os.environ.pop(LOG_ENV, None)
            else:
                os.environ[LOG_ENV] = before


def _guard_walk(package: Path, ranks: dict[str, int]) -> dict:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # what a simulation sets
    app, model_fn = _guard_app()
    sent = model_fn().state_dict()
    lowest = ranks["data"]
    out = {}
    for name in ("context", "context and message"):
        context = Context(run_id=1, node_id=5, node_config={"partition-id": 0}, state=RecordDict(),
                          run_config={"guard": True})

        def message(server_round: int):
            return Message(RecordDict({"arrays": ArrayRecord(sent), "config": ConfigRecord(
                {"server-round": server_round})}), dst_node_id=5, message_type="train")

        app(message(1), context)  # round 1 leaves the guard's memory in the context
        msg = message(2)
        roots = [context, context.state, context.run_config, context.node_config]
        if name != "context":
            roots += [msg, msg.content]
        walk = DerivedWalk(package, ranks, {id(v): v for v in roots}, {__file__}, ("api/captured.py", "audit_update"))
        sys.setprofile(walk.profile)
        try:
            reply = app(msg, context)
        finally:
            sys.setprofile(None)
        if reply.has_error() or int(reply.content["metrics"]["guard-rung"]) != 1:
            raise SystemExit(f"benchmarks structure: the guarded round did not go out under rung 1: {reply}")
        out[name] = {"flow": summarize([s for s in walk.steps if s["floor"] is None or s["floor"] >= lowest]),
                     "all_steps": summarize(walk.steps)}
    return out


def run_with(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks structure")
    parser.add_argument("--root", default=str(HERE), help="the checkout whose gradleak is walked")
    parser.add_argument("--quick", action="store_true", help="accepted; the walk is always small")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    if "gradleak" in sys.modules and not Path(sys.modules["gradleak"].__file__).is_relative_to(root):
        raise SystemExit("benchmarks structure: gradleak was imported before --root took effect")
    sys.path.insert(0, str(root))
    import torch
    from torch import nn

    import gradleak
    from gradleak.data import DatasetSpec, load_dataset

    package = Path(gradleak.__file__).resolve().parent
    if not package.is_relative_to(root):
        raise SystemExit(f"benchmarks structure: imported {package}, not the one under {root}")
    torch.set_num_threads(1)
    ranks = _ranks(root)
    options = dict(attacks=["dlg:iterations=2"], batch_size=1, seed=0, budget="quick")
    # references built at run time: an interned literal "mnist" elsewhere would share the identity
    by_name = _walk(package, ranks, "".join(["le", "net"]), "".join(["mn", "ist"]), **options)
    mnist = load_dataset(DatasetSpec("mnist", split="test"))
    torch.manual_seed(0)
    user_model = nn.Sequential(nn.Conv2d(1, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                               nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
                               nn.Flatten(), nn.Linear(12 * 7 * 7, 10))
    by_object = _walk(package, ranks, user_model, (mnist.inputs[:64].clone(), mnist.labels[:64].clone()), **options)
    return {"root": str(root), "by_name": by_name, "by_object": by_object,
            "flower_guard": guard_walk(package, ranks),
            "largest_modules": [f"{name}: {lines}" for name, lines in largest_modules(package)]}


def run(quick: bool) -> dict:
    return run_with(["--quick"] if quick else [])
