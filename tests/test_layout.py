"""The package layout follows the data flow: data + models → fl → defenses →
Observation (threat) → attacks → metrics → ladder, scenario → experiment → store → analysis → sweep
→ report → api → the client guard → integrations and the command line. Every import, including
those inside functions, must point down this order, and no modules may import
each other in a circle. Inside attacks/ the families (sub-packages) follow the same rule:
base → replay → engine → analytic, text, learned → optimization → malicious → the registry."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gradleak"

# Rank of each top-level module or sub-package of gradleak: an import may only go to an
# equal or lower rank, and equal ranks only within one package.
RANKS: dict[str, int] = {
    "errors": 0,
    "options": 1, "registry": 1, "seeding": 1, "progress": 1, "viz": 1, "priors": 1, "stats": 1, "rero": 1,
    "knowledge": 1,
    "leakage": 2, "modalities": 2,
    "data": 3, "solvers": 3, "postprocess": 3,
    "models": 4,
    "fl": 5,
    "defenses": 6,
    "threat": 7,
    "attacks": 8,
    "metrics": 9,
    "run": 11, "inspect": 11, "theory": 11,
    "utility": 12,
    "store": 13,
    "analysis": 14,
    "sweep": 15,
    "report": 16,
    "api": 17,
    "guard": 18,
    "flower": 19,
    "commands": 20, "testing": 20, "cli": 21, "__main__": 22, "__init__": 22,
}

# Rank of each family inside gradleak/attacks (its sub-package, or base.py; "__init__" is the
# package itself, the registry that names every attack): the same rule one level down.
ATTACK_FAMILY_RANKS: dict[str, int] = {
    "base": 0,  # the attack contract
    "replay": 1,  # the client's update replayed on candidate data, its distances, label recovery
    "engine": 2,  # the optimisation engine, which matches replayed updates
    "analytic": 3, "text": 3, "learned": 3,
    "optimization": 4,  # configurations of the engine; init=learned starts from the learned inverter
    "malicious": 5,  # fishing inverts its isolated gradient with fc_analytic or ig
    "__init__": 6,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every gradleak module `name` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            candidates = [f"{stem}.{alias.name}" for alias in node.names] + [stem]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate.startswith("gradleak") and candidate != name:
                targets.add(candidate)
    return targets


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # `from .x import y` also names the package x's __init__; an import of a sub-module
    # is enough, so drop the package when one of its sub-modules is imported too.
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not any(o.startswith(t + ".") for o in targets)} or targets
    return graph


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_has_a_place_in_the_flow():
    missing = sorted({_top(m) for m in _modules()} - set(RANKS))
    assert not missing, f"give these a rank in RANKS (where they sit in the data flow): {missing}"


def test_no_import_runs_back_up_the_flow():
    upward = []
    for name, targets in _graph().items():
        for target in targets:
            a, b = _top(name), _top(target)
            if a != b and (RANKS[b] > RANKS[a] or (RANKS[b] == RANKS[a])):
                upward.append(f"{name} -> {target}")
    assert not upward, "imports against the flow:\n" + "\n".join(sorted(upward))


def _family(module: str) -> str | None:
    """The attack family of `module` (see ATTACK_FAMILY_RANKS), None outside gradleak.attacks."""
    parts = module.split(".")
    if parts[:2] != ["gradleak", "attacks"]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def test_every_attack_module_sits_in_a_ranked_family():
    missing = sorted({_family(m) for m in _modules()} - {None} - set(ATTACK_FAMILY_RANKS))
    assert not missing, f"give these attack families a rank in ATTACK_FAMILY_RANKS: {missing}"


def test_no_attack_family_imports_its_equal_or_one_above_it():
    upward = []
    for name, targets in _graph().items():
        a = _family(name)
        for target in targets:
            b = _family(target)
            if a is not None and b is not None and a != b and ATTACK_FAMILY_RANKS[b] >= ATTACK_FAMILY_RANKS[a]:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports against the attack families' order:\n" + "\n".join(sorted(upward))


def test_no_import_circle():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_checks_catch_a_circle_and_an_upward_arrow(tmp_path, monkeypatch):
    fake = tmp_path / "gradleak"
    (fake / "fl").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "fl" / "__init__.py").write_text("from ..defenses import x\n")
    (fake / "defenses.py").write_text("from .fl import y\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    graph = _graph()
    assert "gradleak.defenses" in graph["gradleak.fl"] and "gradleak.fl" in graph["gradleak.defenses"]
    try:
        test_no_import_runs_back_up_the_flow()
    except AssertionError as exc:
        assert "gradleak.fl -> gradleak.defenses" in str(exc)
    else:
        raise AssertionError("an upward import went unnoticed")
    try:
        test_no_import_circle()
    except AssertionError as exc:
        assert "import circles" in str(exc)
    else:
        raise AssertionError("an import circle went unnoticed")


def test_the_family_check_catches_an_upward_arrow(tmp_path, monkeypatch):
    fake = tmp_path / "gradleak"
    for family in ("engine", "learned"):
        (fake / "attacks" / family).mkdir(parents=True)
        (fake / "attacks" / family / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "attacks" / "__init__.py").write_text("")
    (fake / "attacks" / "engine" / "initialization.py").write_text(
        "def start():\n    from ..learned.learned import learned_start\n")
    (fake / "attacks" / "learned" / "learned.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    try:
        test_no_attack_family_imports_its_equal_or_one_above_it()
    except AssertionError as exc:
        assert "gradleak.attacks.engine.initialization -> gradleak.attacks.learned.learned" in str(exc)
    else:
        raise AssertionError("an upward import between attack families went unnoticed")


# The tests mirror the package: each folder under tests/ is named after the gradleak package or
# module its files test (tests/store ↔ gradleak/store.py, tests/attacks/text ↔ gradleak/attacks/text/),
# so a test is found where its subject lives. tests/support holds helpers, not tests.
TESTS = Path(__file__).resolve().parent
TEST_HELPERS = ("support",)
AT_THE_TESTS_ROOT = {"__init__.py", "conftest.py", "test_layout.py"}  # the layout tests the whole package


def _mirror_misses(tests: Path, package: Path) -> list[str]:
    misses = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir() and "__pycache__" not in p.parts):
        relative = folder.relative_to(tests)
        if relative.parts[0] in TEST_HELPERS:
            misses += [f"tests/{f.relative_to(tests)}: a test among the helpers" for f in folder.glob("test_*.py")]
        elif not ((package / relative).is_dir() or (package / relative).with_suffix(".py").is_file()):
            misses.append(f"tests/{relative}/ names no gradleak package or module")
    misses += [f"tests/{p.name} sits at the tests root" for p in sorted(tests.glob("*.py"))
               if p.name not in AT_THE_TESTS_ROOT]
    return misses


def test_the_tests_mirror_the_package():
    assert _mirror_misses(TESTS, PACKAGE) == []


def test_the_mirror_check_catches_a_stray_folder_and_a_root_test(tmp_path):
    package, tests = tmp_path / "gradleak", tmp_path / "tests"
    (package / "attacks" / "text").mkdir(parents=True)
    (package / "store.py").write_text("")
    for folder in ("attacks/text", "store", "support", "scenarios"):
        (tests / folder).mkdir(parents=True)
    for name in ("conftest.py", "test_layout.py", "test_seeding.py", "support/test_helper.py"):
        (tests / name).write_text("")
    assert _mirror_misses(tests, package) == ["tests/scenarios/ names no gradleak package or module",
                                              "tests/support/test_helper.py: a test among the helpers",
                                              "tests/test_seeding.py sits at the tests root"]
