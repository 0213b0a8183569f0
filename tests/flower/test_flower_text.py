"""gradleak.flower on a Flower app that trains a language model: the example app in
examples/flower_text (8 clients, FedAvg, a small GPT-2 learning next-token prediction on news
text, one local SGD step over 4 sequences), audited with DAGER."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

flwr = pytest.importorskip("flwr")

from gradleak.fl import compute_update  # noqa: E402
from gradleak.flower import run_app  # noqa: E402
from gradleak.report import write_report  # noqa: E402
from gradleak.store import ResultStore  # noqa: E402

pytestmark = pytest.mark.slow  # a Flower simulation starts Ray

APP = Path(__file__).resolve().parents[2] / "examples" / "flower_text"


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    torch.set_num_threads(1)
    return run_app(APP, out=tmp_path_factory.mktemp("flower-text"), rounds=(1,), clients=2, attacks=["dager"],
                   lpips="none")


def test_a_text_client_update_is_what_gradleak_computes_and_dager_recovers_it(text_run, tmp_path):
    from flower_text.task import Net  # importable once run_app has loaded the app

    captured = text_run.captured
    assert len(captured) == 2 and text_run.training.lr == 0.01
    for c in captured:
        assert c.inputs.dtype == torch.long and c.inputs.shape == (4, 16) and c.labels.shape == (4, 16)
        model = Net()
        model.load_state_dict(c.sent)
        simulated = compute_update(model, c.inputs, c.labels, c.training)
        worst = max(float((simulated.tensors[n] - c.update.tensors[n]).abs().max()) for n in simulated.tensors)
        scale = max(float(t.abs().max()) for t in simulated.tensors.values())
        assert c.update.kind == "delta" and c.update.steps == 1 and worst <= 1e-5 * scale
        assert c.training_check.confirmed
    with ResultStore(text_run.store, create=False) as store:
        cells = store.cells("attack")
        assert len(cells) == 2 and all(c.metrics["asr"] == 1.0 and c.metrics["rouge1"] == 1.0 for c in cells)
    report = write_report(text_run.store, tmp_path)
    verdict = next(e for e in report["strongest"] if e["defense"] == "none")
    assert verdict["verdict_text"] == "leaks: 8 of 8 examples copied exactly (token for token) by dager"
    assert report["texts"] == 2 and "ROUGE-1" in Path(report["html"]).read_text()


LORA_RANK = 96  # 4 sequences × 16 tokens = 64 rows to span, within the rank and gpt2's width 128


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    torch.set_num_threads(1)
    return run_app(APP, out=tmp_path_factory.mktemp("flower-text-lora"), run_config={"lora-rank": LORA_RANK},
                   rounds=(1,), clients=2, attacks=["dager"], lpips="none")


def test_a_lora_client_sends_only_adapters_and_dager_recovers_its_batch(lora_run):
    """The app's LoRA mode (run config lora-rank): the server sends and receives only the
    adapters; the hook puts them on model_fn's base model, the declared training (lora_rank
    from the run config) reproduces each update, and DAGER reads the batch from the adapters."""
    from flower_text.task import Net

    from gradleak.models.lora import apply_lora

    assert lora_run.training.lora_rank == LORA_RANK and len(lora_run.captured) == 2
    for c in lora_run.captured:
        assert set(c.sent) == set(c.update.tensors) == {f"blocks.{i}.attn.qkv.lora_{m}" for i in (0, 1)
                                                         for m in "AB"}
        model = apply_lora(Net(), LORA_RANK)
        model.load_state_dict(c.sent, strict=False)
        simulated = compute_update(model, c.inputs, c.labels, c.training)
        assert set(simulated.tensors) == set(c.update.tensors)
        assert c.training_check.confirmed
    with ResultStore(lora_run.store, create=False) as store:
        cells = store.cells("attack")
        assert len(cells) == 2 and all(c.metrics["asr"] == 1.0 and c.metrics["rouge1"] == 1.0 for c in cells)
