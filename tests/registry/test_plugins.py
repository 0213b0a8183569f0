"""Components from outside gradleak: `Registry.register` at run time, and an installed
package's entry points (group `gradleak.defenses`) used from the command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradleak.errors import GradleakError
from gradleak.registry import Registry

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
from dataclasses import dataclass

from gradleak.defenses.base import Defense


@dataclass
class EraseOptions:
    keep: float = 0.0


class Erase(Defense):
    """Scales the update by `keep` (0: the server receives zeros)."""

    name = "erase"
    Options = EraseOptions

    def transform_update(self, update, ctx):
        return update.map(lambda _, t: t * self.options.keep)

    def two_layer(self, view):
        return view.result(lambda x_: view.plain(x_) * self.options.keep)
'''


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """A package laid out as pip installs one: the module and its dist-info with entry points."""
    root = tmp_path_factory.mktemp("site")
    (root / "gradleak_erase_plugin.py").write_text(PLUGIN)
    info = root / "gradleak_erase_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gradleak-erase-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gradleak.defenses]\nerase = gradleak_erase_plugin:Erase\n"
                                           "broken = gradleak_missing_module:Nothing\n")
    return root


def _cli(plugin_path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "gradleak", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def _psnr(plugin_path, defense):
    proc = _cli(plugin_path, "attack", "--dataset", "mnist", "--model", "lenet", "--attack", "cpl:iterations=30",
                "--defense", defense, "--lpips", "none", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["metrics"]["psnr"]


def test_entry_point_defense_runs_from_the_cli(plugin_path):
    listing = _cli(plugin_path, "list", "defenses")
    assert "Scales the update by `keep`" in listing.stdout
    assert "broken" in listing.stdout and "cannot be loaded" in listing.stdout
    # keep=1 leaves the update as sent: CPL reconstructs (45 dB measured); keep=0 sends zeros
    kept, erased = _psnr(plugin_path, "erase:keep=1"), _psnr(plugin_path, "erase:keep=0")
    assert kept >= 30 and erased <= 12, (kept, erased)


def test_entry_point_defense_in_the_two_layer_analysis(plugin_path):
    """The plugin's class gives its two-layer map: `gradleak bound` lists and takes it by name, and
    scaling the observed gradient by keep scales the bound by 1/keep."""
    assert "secagg, erase" in " ".join(_cli(plugin_path, "bound", "--help").stdout.split())
    args = ("bound", "--d", "3", "--m", "8", "--batch-size", "2", "--noise", "0.1", "--json")
    proc = _cli(plugin_path, *args, "--defense", "erase:keep=1", "--defense", "erase:keep=0.5")
    assert proc.returncode == 0, proc.stderr
    kept, halved = (b["lower_numeric"] for b in json.loads(proc.stdout)["bounds"])
    assert halved == pytest.approx(2 * kept, rel=1e-9)
    refused = _cli(plugin_path, *args, "--defense", "topk")
    assert refused.returncode == 2 and "covers the defenses none, local," in refused.stderr
    assert "erase" in refused.stderr and "broken" not in refused.stderr


def test_a_plugin_that_does_not_import_is_one_line(plugin_path):
    proc = _cli(plugin_path, "attack", "--dataset", "mnist", "--model", "lenet", "--attack", "dlg",
                "--defense", "broken")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "No module named 'gradleak_missing_module'" in proc.stderr


def test_register_checks_names():
    registry = Registry("defense", {"noise": "gradleak.defenses.noise:GaussianNoise"}, group="gradleak.none")

    class Halve:
        name = "halve"

    registry.register("halve", Halve)
    assert registry.get("halve") is Halve and "halve" in registry.names()
    with pytest.raises(GradleakError, match="built-in"):
        registry.register("noise", Halve)
    with pytest.raises(GradleakError, match="already registered"):
        registry.register("halve", Halve)
    with pytest.raises(GradleakError, match="calls itself 'halve'"):
        registry.register("half", Halve)
    registry.register("halve", "gradleak.defenses.clip:UpdateClipping", replace=True)
    with pytest.raises(GradleakError, match="calls itself 'clip'"):
        registry.get("halve")


CONTRACT_PLUGIN = '''
import math
from dataclasses import dataclass

from torch import nn

from gradleak.attacks.optimization.ig import IGOptions, InvertingGradients


@dataclass
class SmoothIGOptions(IGOptions):
    tv: float = 1e-3  # a heavier total-variation prior than Inverting Gradients' own


class SmoothIG(InvertingGradients):
    """Inverting Gradients with a heavier total-variation prior."""

    name = "smooth-ig"
    Options = SmoothIGOptions


def build_wide(spec):
    """One wide ReLU layer on the flattened input."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(spec.input_shape), 64), nn.ReLU(),
                         nn.Linear(64, spec.num_classes))
'''

BROKEN_MODEL = '''


class Frozen(nn.Module):
    """A layer the loss never reaches: the contract says which parameters it misses."""

    def __init__(self, spec):
        super().__init__()
        self.head, self.unused = nn.Linear(math.prod(spec.input_shape), spec.num_classes), nn.Linear(3, 3)

    def forward(self, x):
        return self.head(x.flatten(1))


def build_frozen(spec):
    """A linear head beside a layer the loss never reaches."""
    return Frozen(spec)
'''


def test_gradleak_testing_checks_plugins_registered_by_entry_points(tmp_path):
    """A plugin package's own test: its attack, model and defense, found through entry points,
    pass gradleak.testing's contract checks; a model that breaks the contract is named with
    the part it breaks."""
    (tmp_path / "gradleak_contract_plugin.py").write_text(CONTRACT_PLUGIN + BROKEN_MODEL)
    (tmp_path / "gradleak_erase_plugin.py").write_text(PLUGIN)
    info = tmp_path / "gradleak_contract_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gradleak-contract-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[gradleak.attacks]\nsmooth-ig = gradleak_contract_plugin:SmoothIG\n"
        "[gradleak.models]\nwide = gradleak_contract_plugin:build_wide\n"
        "frozen = gradleak_contract_plugin:build_frozen\n"
        "[gradleak.defenses]\nerase = gradleak_erase_plugin:Erase\n")
    script = (
        "from gradleak.testing import ContractError, check_attack, check_defense, check_model\n"
        "check_attack('smooth-ig'); check_model('wide'); check_defense('erase')\n"
        "try:\n    check_model('frozen')\nexcept ContractError as exc:\n    print('broken:', exc)\n"
        "else:\n    print('broken: passed')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "broken: parameters the loss does not reach: ['unused.weight', 'unused.bias']", \
        proc.stdout
