"""The public API (`gradleak.audit`, `gradleak.audit_update`) and the CLI with the
user's own model file and data files: one path with the built-in scenarios."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import gradleak
from gradleak.cli import main
from gradleak.fl import TrainingSpec, compute_update
from gradleak.models import ModelSpec, build_model
from gradleak.run.experiment import AttackRunSpec, run_attack

README = Path(__file__).resolve().parents[2] / "README.md"

# A user's model file as they would write it: their own class and factory.
USER_MODEL_FILE = '''
import torch
from torch import nn

class SmallNet(nn.Module):
    def __init__(self, num_classes=10, width=12):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, width, 5, padding=2, stride=2), nn.Sigmoid(),
                                      nn.Conv2d(width, width, 5, padding=2, stride=2), nn.Sigmoid())
        self.head = nn.Linear(width * 7 * 7, num_classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))

def build(num_classes, width=12):
    return SmallNet(num_classes, width)

def not_a_model():
    return 42
'''


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "user_model.py"
    path.write_text(USER_MODEL_FILE)
    return path


@pytest.fixture
def mnist_npz(tmp_path, mnist_test):
    path = tmp_path / "client.npz"
    np.savez(path, inputs=mnist_test.inputs[:32].numpy(), labels=mnist_test.labels[:32].numpy())
    return path


def run_cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_readme_snippet_runs_as_written(tmp_path, monkeypatch):
    torch.manual_seed(0)  # the snippet's model draws its weights from the global generator
    """The README's API example, executed verbatim: every attack the honest
    server may run on a user-defined sigmoid CNN, with a report."""
    text = README.read_text()
    block = re.search(r"## Auditing your own model and data.*?```python\n(.*?)```", text, re.S)
    assert block, "README lost its API example"
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)  # noqa: S102 - our own README
    result = scope["result"]
    assert (tmp_path / "audit-report" / "index.html").is_file()
    ran = {r.spec.attack.split(":")[0] for r in result.runs}
    skipped = {s.attack.split(":")[0]: s.reason for s in result.skipped}
    # Malicious-server and label/BN-informed attacks are ruled out by the honest threat model,
    # architecture-specific ones by the modules (a conv-first model, no batch norm, not two-layer).
    assert "malicious_model" in skipped["rtf"] and "malicious_model" in skipped["mkor"]
    assert "bn_statistics" in skipped["gradinversion"]
    assert "tensor" in skipped and "fc-analytic" in skipped
    assert {"ig", "cpl", "dlg"} <= ran
    assert not ran & set(skipped)
    # FedSGD on one image of a sigmoid CNN leaks: the strongest attack reconstructs it
    # (measured 68.5-71.2 dB with the snippet at seeds 0-2; 30 dB is the ASR threshold).
    assert result.strongest("psnr").metrics["psnr"] >= 50
    html = (tmp_path / "audit-report" / "index.html").read_text()
    assert "Attacks not run" in html and "malicious_model" in html


def test_audit_of_objects_equals_the_named_scenario(mnist_test):
    """A built-in model and dataset through the API give exactly what the CLI's
    named scenario gives: one code path."""
    spec = AttackRunSpec(dataset="mnist", model="lenet", attack="cpl:iterations=40", batch_size=1,
                         defenses=("noise:sigma=0.001",), seed=3, lpips="none")
    named = run_attack(spec)
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=3))
    result = gradleak.audit(model, (mnist_test.inputs, mnist_test.labels), attacks=["cpl:iterations=40"],
                            defenses=["noise:sigma=0.001"], batch_size=1, seed=3, lpips="none",
                            budget="standard")
    assert [r.spec.attack for r in result.runs] == ["cpl:iterations=40"]
    ours = result.runs[0]
    # The galleries differ by design (the user's tensors; the named dataset's split): the gallery
    # judgements agree because the reconstruction is a copy (rank 0, linkage 1), but the linkage's
    # null variance is a property of the whole gallery
    gallery_wide = {"linkage_null_var"}
    assert {k: v for k, v in ours.metrics.items() if k not in gallery_wide} == \
        {k: v for k, v in named.metrics.items() if k not in gallery_wide}
    assert ours.metrics["linkage"] == named.metrics["linkage"] == 1.0
    # a member's AUC among m members is uniform on m values under the null: variance
    # (m + 1) / (12 (m − 1)) without ties, 1/12 + 1/600 for m − 1 = 100 gallery examples of its
    # label (here about 167: 0.08433; ties lower it)
    assert 0 < ours.metrics["linkage_null_var"] <= 1 / 12 + 1 / 600
    assert torch.equal(ours.reconstructions, named.reconstructions)
    # the user's model object is left as it was
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 build_model(ModelSpec("lenet", (1, 28, 28), 10,
                                                                       seed=3)).state_dict().values()))


def test_audit_accepts_dataset_and_dataloader_and_objects(mnist_test):
    from torch.utils.data import DataLoader, TensorDataset

    from gradleak.defenses import make_defense

    x, y = mnist_test.inputs[:16], mnist_test.labels[:16]
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    results = []
    for data in (TensorDataset(x, y), DataLoader(TensorDataset(x, y), batch_size=5), (x.numpy(), y.numpy())):
        results.append(gradleak.audit(model, data, attacks=["dlg:iterations=5"],
                                      defenses=[make_defense("clip:bound=2")], lpips="none"))
    metrics = [r.runs[0].metrics for r in results]
    assert metrics[0] == metrics[1] == metrics[2]
    assert results[0].setting["defenses"] == ["clip:bound=2"]


def test_audit_update_equals_simulated_client(mnist_test):
    """An update captured elsewhere (as gradleak.flower captures it) attacked
    through audit_update scores as the simulated client does."""
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=1))
    order = torch.randperm(len(mnist_test), generator=torch.Generator().manual_seed(1))
    x, y = mnist_test.inputs[order[:1]], mnist_test.labels[order[:1]]
    training = TrainingSpec(lr=0.1)
    update = compute_update(model, x, y, training)
    captured = gradleak.audit_update(model, update, x, y, training=training, attacks=["cpl:iterations=40"],
                                     seed=1, lpips="none", budget="standard")
    simulated = gradleak.audit(model, (mnist_test.inputs, mnist_test.labels), attacks=["cpl:iterations=40"],
                               seed=1, lpips="none", budget="standard")
    assert captured.runs[0].metrics["mse"] == pytest.approx(simulated.runs[0].metrics["mse"], rel=1e-4, abs=1e-9)
    skipped = gradleak.audit_update(model, update, x, y, training=training, attacks=["rtf"],
                                    threat="malicious", lpips="none")
    assert not skipped.runs and "modified model" in skipped.skipped[0].reason


def test_audit_update_warns_when_the_model_output_ignores_its_input(mnist_test):
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=1))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    x, y = mnist_test.inputs[:4], mnist_test.labels[:4]
    training = TrainingSpec(lr=0.1)
    update = compute_update(model, x, y, training)
    with pytest.warns(UserWarning, match="same output for every input"):
        gradleak.audit_update(model, update, x, y, training=training, attacks=["cpl:iterations=2"], lpips="none")


def test_audit_refuses_bad_input(mnist_test):
    from gradleak.errors import GradleakError

    x, y = mnist_test.inputs[:8], mnist_test.labels[:8]
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    with pytest.raises(GradleakError, match="unknown attack"):
        gradleak.audit(model, (x, y), attacks=["bogus"])
    with pytest.raises(GradleakError, match="budget"):
        gradleak.audit(model, (x, y), budget="huge")
    with pytest.raises(GradleakError, match="nn.Module"):
        gradleak.audit(lambda: 42, (x, y))
    with pytest.raises(GradleakError):
        gradleak.audit(nn.Sequential(nn.Flatten(), nn.Linear(784, 5)), (x, y))  # 5 outputs, 10 classes
    with pytest.raises(GradleakError):
        gradleak.audit(model, (x, y[:4]))


def test_cli_audit_with_user_model_file_and_tensor_file(model_file, mnist_npz, tmp_path, capsys):
    out = tmp_path / "report"
    code, stdout, err = run_cli(["audit", "--model", f"{model_file}:build:width=8", "--dataset", str(mnist_npz),
                                 "--attack", "cpl:iterations=30", "--attack", "rtf", "--lpips", "none",
                                 "--out", str(out), "--json"], capsys)
    assert code == 0, err
    payload = json.loads(stdout)
    assert [r["attack"] for r in payload["runs"]] == ["cpl:iterations=30"]
    assert payload["runs"][0]["model"] == f"{model_file}:build:width=8"
    assert payload["skipped"][0]["attack"] == "rtf" and "malicious_model" in payload["skipped"][0]["reason"]
    assert (out / "index.html").is_file() and (out / "results.db").is_file()
    # the same through `gradleak attack`, and the numbers agree
    code, stdout, err = run_cli(["attack", "--model", f"{model_file}:build:width=8", "--dataset", str(mnist_npz),
                                 "--attack", "cpl:iterations=30", "--lpips", "none", "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["metrics"] == payload["runs"][0]["metrics"]


@pytest.mark.parametrize("model_ref, message", [
    ("{dir}/missing.py:build", "not found"),
    ("{file}:nowhere", "nowhere"),
    ("{file}:not_a_model", "nn.Module"),
    ("{broken}:build", "ZeroDivisionError"),
])
def test_cli_refuses_bad_user_model(model_ref, message, model_file, mnist_npz, tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1 / 0\n")
    ref = model_ref.format(dir=tmp_path, file=model_file, broken=broken)
    code, stdout, err = run_cli(["attack", "--model", ref, "--dataset", str(mnist_npz), "--attack", "dlg",
                                 "--json"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


def test_cli_refuses_model_that_does_not_fit_the_classes(tmp_path, mnist_npz, capsys):
    path = tmp_path / "tiny.py"
    path.write_text("from torch import nn\ndef build():\n    return nn.Sequential(nn.Flatten(), nn.Linear(784, 3))\n")
    code, _, err = run_cli(["audit", "--model", f"{path}:build", "--dataset", str(mnist_npz),
                            "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "class" in err


def test_sweep_accepts_user_model_and_data_references(model_file, mnist_npz, tmp_path, capsys):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(textwrap.dedent(f"""
        name: own
        defaults: {{lpips: none}}
        grids:
          - datasets: ["{mnist_npz}"]
            models: ["{model_file}:build:width=8"]
            batch_sizes: [1]
            attacks: ["dlg:iterations=5"]
        """))
    store = tmp_path / "results.db"
    code, _, err = run_cli(["sweep", str(spec), "--store", str(store), "--workers", "1"], capsys)
    assert code == 0, err
    from gradleak.store import ResultStore

    with ResultStore(store, create=False) as s:
        cells = s.cells("attack")
    assert len(cells) == 1 and cells[0].labels["model"] == f"{model_file}:build:width=8"


@pytest.mark.parametrize("device", ["mps", "meta", "lazy", "hpu", "cuda:x"])
def test_unknown_devices_are_refused(device, capsys):
    code = main(["attack", "--dataset", "mnist", "--model", "lenet", "--attack", "dlg", "--device", device])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "device" in err


def test_precode_with_its_defaults_runs_and_keeps_the_model_copyable(capsys):
    code = main(["attack", "--dataset", "mnist", "--model", "lenet", "--attack", "dlg:iterations=2",
                 "--defense", "precode", "--lpips", "none", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["defenses"] == ["precode"]


def test_results_read_in_one_minute_a_short_repr_and_a_summary_with_the_verdict(mnist_test):
    result = gradleak.audit("lenet", (mnist_test.inputs[:40], mnist_test.labels[:40]),
                            attacks=["cpl:iterations=20"], seed=[0, 1], lpips="none")
    assert len(repr(result)) < 200 and "2 attack run(s)" in repr(result)
    strongest = result.strongest()
    assert len(repr(strongest)) < 400 and "tensor" not in repr(strongest)
    summary = result.summary()
    assert len(summary.splitlines()) == 4  # setting, verdict, one line per run
    # your own data: reconstructions are re-identified among the 39 examples not attacked
    assert summary.splitlines()[1] == ("verdict: leaks: 2 of 2 examples copied exactly (MSE ≤ 1e-3) by "
                                       "cpl:iterations=20")
    assert "chance 2.5%" in summary  # SSIM alone (LPIPS off): 1 / (39 + 1)



def test_audits_sample_ladder_runs_only_the_attacks_the_open_verdict_names(mnist_test, monkeypatch):
    """The audit's sample ladder follows the verdict's `ladder_attacks` as the sweep's does:
    the fresh seeds run only the attack named (gradleak.analysis.verdict), every attack when
    none is named or on the last rung (gradleak.sweep.sample_plan.every_attack_target)."""
    from gradleak.api.result import AuditResult
    from gradleak.leakage import SAMPLE_SEED_OFFSET

    named: list = [["cpl:iterations=4"]]

    def verdicts(self):
        return [{"open": True, "min_examples": 2, "needed_examples": 40, "ladder_have": 2, "ladder_needed": 4,
                 "ladder_attacks": named[0]}] if len(self.runs) <= 4 else []

    monkeypatch.setattr(AuditResult, "verdicts", verdicts)
    model = build_model(ModelSpec("lenet", (1, 28, 28), 10, seed=0))
    data = (mnist_test.inputs[:64], mnist_test.labels[:64])
    attacks = ["dlg:iterations=4", "cpl:iterations=4"]
    # two rungs: the first (not the last) runs the named attack, after which nothing is open
    result = gradleak.audit(model, data, attacks=attacks, seed=[0, 1], lpips="none", sample_rungs=2)
    fresh = [r.spec.attack for r in result.runs if r.spec.seed >= SAMPLE_SEED_OFFSET]
    assert sorted(fresh) == ["cpl:iterations=4"] * 2 and len(result.runs) == 6
    # one rung, the last: every attack, the named one or not
    result = gradleak.audit(model, data, attacks=attacks, seed=[0, 1], lpips="none", sample_rungs=1)
    fresh = [r.spec.attack for r in result.runs if r.spec.seed >= SAMPLE_SEED_OFFSET]
    assert sorted(fresh) == sorted(attacks * 2)
    named[0] = None
    result = gradleak.audit(model, data, attacks=attacks, seed=[0, 1], lpips="none", sample_rungs=1)
    fresh = [r.spec.attack for r in result.runs if r.spec.seed >= SAMPLE_SEED_OFFSET]
    assert sorted(fresh) == sorted(attacks * 2)
