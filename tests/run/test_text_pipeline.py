"""Text through the scenario runner: `gradleak attack` with DAGER on the news corpus and gpt2,
its JSON and --out files, one-line refusals of mismatched inputs, text scoring and the
automatic attack selection."""
from __future__ import annotations

import json
import re

import pytest
import torch

from gradleak.api import select_attacks
from gradleak.attacks import ATTACKS
from gradleak.cli import main
from gradleak.data import DatasetSpec, load_dataset
from gradleak.data import text as text_data
from gradleak.errors import GradleakError
from gradleak.metrics import score_batch, summarize
from gradleak.models import ModelSpec, build_model
from gradleak.run.experiment import AttackRunSpec, run_attack
from gradleak.threat import make_threat_model

SMALL_GPT2 = "gpt2:width=128,heads=4"  # 4 × 8 tokens sit far below DAGER's limit of width − 20
TEXT_KEYS = ("rouge1", "rouge2", "rougeL", "token_accuracy", "exact_sequence_accuracy")


def cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["attack", *args])
    except SystemExit as exc:  # argparse refuses a flag's value by exiting
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_dager_on_news_through_the_cli(capsys, tmp_path):
    code, out, err = cli(capsys, "--dataset", "news", "--model", SMALL_GPT2, "--attack", "dager",
                         "--batch-size", "4", "--seq-len", "8", "--json", "--out", str(tmp_path))
    assert code == 0, err
    result = json.loads(out)  # exactly one JSON object
    metrics = result["metrics"]
    assert metrics["rouge1"] >= 0.99 and metrics["rouge2"] >= 0.99
    assert all(key in metrics for key in TEXT_KEYS)
    assert metrics["exact_sequence_accuracy"] == metrics["asr"] == 1.0 and metrics["examples"] == 4
    assert not {"psnr", "ssim", "lpips", "mse"} & set(metrics)  # pixel metrics do not apply to text
    # re-identified among the train split's sequences by token overlap; chance 1 / (gallery + 1)
    assert metrics["reid"] == 1.0 and metrics["gallery"] >= 500 and metrics["reid_chance"] < 0.01
    assert result["extras"]["ladder"]["decision"] == "leak"
    assert result["spec"]["seq_len"] == 8
    first = result["per_example"][0]
    assert first["success"] and first["original"] == first["recovered"] and first["original"].strip()
    # --out: the sentences side by side instead of a picture grid
    assert (tmp_path / "result.json").exists() and not (tmp_path / "grid.png").exists()
    pairs = (tmp_path / "sequences.txt").read_text(encoding="utf-8")
    assert pairs.count("original:") == 4 and first["recovered"] in pairs


def test_human_readable_text_summary(capsys):
    code, out, err = cli(capsys, "--dataset", "news", "--model", SMALL_GPT2, "--attack", "dager",
                         "--batch-size", "2", "--seq-len", "8")
    assert code == 0, err
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:] if len(line.split()) == 2}
    assert rows["rouge1"] == "1" and rows["exact_sequence_accuracy"] == "1"
    assert "psnr" not in out


@pytest.mark.slow
def test_the_issue_command_recovers_a_batch_of_16():
    """`gradleak attack --dataset news --model gpt2 --attack dager --batch-size 16`: the default
    gpt2 (width 384) and news windows (16 tokens) hold 256 layer inputs, under 384 − 20."""
    result = run_attack(AttackRunSpec(dataset="news", model="gpt2", attack="dager", batch_size=16))
    assert result.metrics["rouge1"] >= 0.99 and result.metrics["rouge2"] >= 0.99
    assert result.metrics["exact_sequence_accuracy"] == 1.0


def test_classifier_on_polarity_through_the_runner():
    # a classifier's gradient sees the last position only after the final block: DAGER's
    # second block must not be the last one
    result = run_attack(AttackRunSpec(dataset="polarity", model="gpt2:width=256,heads=4,layers=3",
                                      attack="dager", batch_size=4, seq_len=24))
    assert result.metrics["rouge1"] >= 0.99 and result.metrics["exact_sequence_accuracy"] == 1.0
    assert all(isinstance(s["label"], int) for s in result.per_example)


def test_a_saturated_span_is_reported_not_hidden():
    # 4 × 32 = 128 layer inputs fill a 128-wide model: DAGER cannot tell tokens apart
    result = run_attack(AttackRunSpec(dataset="news", model=SMALL_GPT2, attack="dager", batch_size=4, seq_len=32))
    assert "wider gpt2" in result.extras["saturated"][0]
    assert result.metrics["exact_sequence_accuracy"] < 1.0


@pytest.mark.parametrize("args, message", [
    (("--dataset", "mnist", "--model", "lenet", "--attack", "dager"), "attack 'dager' does not handle image data"),
    (("--dataset", "news", "--model", "lenet", "--attack", "dager"), "model 'lenet' needs image inputs"),
    (("--dataset", "news", "--model", "gpt2", "--attack", "dager", "--seq-len", "0"), "--seq-len: 0 is out of range"),
    (("--dataset", "mnist", "--model", "lenet", "--attack", "ig", "--seq-len", "8"),
     "seq_len only applies to text"),
    (("--dataset", "news", "--model", SMALL_GPT2, "--attack", "ig"), "attack 'ig' does not handle text data"),
    (("--dataset", "news", "--model", SMALL_GPT2, "--attack", "dager", "--local-steps", "2", "--optimizer", "adam"),
     "optimizer 'adam' rescales or decays the weights"),
    (("--dataset", "news", "--model", SMALL_GPT2, "--attack", "tag", "--lora", "4"),
     "attack 'tag' cannot invert a LoRA client's update"),
    (("--dataset", "polarity", "--model", SMALL_GPT2, "--attack", "dager"),
     "classifier head needs at least 3 transformer blocks"),
    (("--dataset", "news", "--model", "mlp", "--attack", "dager"), "use a text model such as gpt2"),
    (("--dataset", "news", "--model", SMALL_GPT2, "--attack", "tag", "--local-steps", "2"),
     "attack 'tag' matches one FedSGD gradient"),
    (("--dataset", "news", "--model", SMALL_GPT2, "--attack", "lamp", "--local-steps", "2"),
     "attack 'lamp' matches one FedSGD gradient"),
    (("--dataset", "mnist", "--model", "lenet", "--attack", "tag"), "attack 'tag' does not handle image data"),
])
def test_mismatched_inputs_are_refused_in_one_line(capsys, args, message):
    code, out, err = cli(capsys, *args, "--json")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_text_scores_dispatch_on_the_modality():
    originals = torch.tensor([[10, 11, 12, 13], [20, 21, text_data.PAD_TOKEN, text_data.PAD_TOKEN]])
    recovered = originals[[1]].clone()  # one of the two sequences, recovered exactly
    scores, aligned = score_batch(originals, torch.tensor([0, 1]), recovered, None, "text")
    assert [s.success for s in scores] == [False, True] and [s.matched for s in scores] == [False, True]
    assert torch.equal(aligned[1], originals[1]) and bool((aligned[0] == text_data.PAD_TOKEN).all())
    summary = summarize(scores)
    assert summary["exact_sequence_accuracy"] == summary["asr"] == 0.5 and summary["matched"] == 0.5
    assert summary["rouge1"] == pytest.approx(0.5) and "psnr" not in summary


def test_auto_selection_picks_the_text_attacks_and_skips_image_attacks():
    news = load_dataset(DatasetSpec("news", split="test", seq_len=8))
    model = build_model(ModelSpec("gpt2", news.input_shape, news.num_classes, options={"width": 64, "heads": 4}))
    selected, skipped = select_attacks("auto", model, news.input_shape, news.num_classes, "text",
                                       make_threat_model("honest"))
    # at the "quick" preset the optimising attacks run 200 steps, a minute on one core at batch 4
    assert selected == ["dager", "tag:iterations=200", "lamp:iterations=200"]
    reasons = {s.attack.split(":")[0]: s.reason for s in skipped}
    assert set(reasons) == set(ATTACKS.names()) - {"dager", "tag", "lamp"}
    assert all(reason for reason in reasons.values())
    assert reasons["ig"] == "does not handle text data"
    # and the other way round: dager has nothing to do on images, or on a text model it cannot invert
    lenet = build_model(ModelSpec("lenet", (1, 28, 28), 10))
    _, skipped = select_attacks("auto", lenet, (1, 28, 28), 10, "image", make_threat_model("honest"))
    assert {s.attack: s.reason for s in skipped}["dager"] == "does not handle image data"
    shallow = build_model(ModelSpec("gpt2", news.input_shape, news.num_classes,
                                    options={"width": 64, "heads": 4, "layers": 1}))
    _, skipped = select_attacks(["dager"], shallow, news.input_shape, news.num_classes, "text",
                                make_threat_model("honest"))
    assert "at least 2 transformer blocks" in skipped[0].reason


def test_dager_check_and_run_time_agree():
    """A model the check rules out stops with the same reason when the attack is forced."""
    news = load_dataset(DatasetSpec("news", split="test", seq_len=8))
    options = {"width": 64, "heads": 4, "layers": 1}
    shallow = build_model(ModelSpec("gpt2", news.input_shape, news.num_classes, options=options))
    reason = ATTACKS.get("dager")().unsupported(shallow, news.input_shape, news.num_classes, "text")
    assert reason
    with pytest.raises(GradleakError, match=re.escape(reason)):
        run_attack(AttackRunSpec(dataset="news", model="gpt2:width=64,heads=4,layers=1", attack="dager",
                                 batch_size=2, seq_len=8))


def test_audit_on_text_runs_dager_and_words_its_verdict_for_text():
    import gradleak

    # which attacks "auto" picks for text is test_auto_selection_picks_dager_for_text_and_skips_image_attacks's
    result = gradleak.audit(SMALL_GPT2, "news", attacks=["dager"], batch_size=2, seed=0, lpips="none")
    assert [run.spec.attack for run in result.runs] == ["dager"]
    assert "copied exactly (token for token) by dager" in result.summary()
    assert all(skipped.reason for skipped in result.skipped)


def test_audit_takes_the_sequence_length(capsys, tmp_path):
    """`gradleak audit --seq-len` and `gradleak.audit(seq_len=)` attack, score and re-identify
    windows of that length; a user's own sequences keep theirs (one line)."""
    import gradleak

    code = main(["audit", "--dataset", "news", "--model", SMALL_GPT2, "--attack", "dager", "--batch-size", "2",
                 "--seq-len", "6", "--lpips", "none", "--json", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert [run["spec"]["seq_len"] for run in runs] == [6]
    assert runs[0]["metrics"]["rouge1"] >= 0.99 and runs[0]["metrics"]["gallery"] >= 500
    result = gradleak.audit(SMALL_GPT2, "news", attacks=["dager"], batch_size=2, seq_len=6, lpips="none")
    assert tuple(result.runs[0].originals.shape) == (2, 6)
    with pytest.raises(GradleakError, match="seq_len applies to the named text datasets"):
        gradleak.audit(SMALL_GPT2, (torch.zeros(2, 6, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long)),
                       attacks=["dager"], seq_len=6)


def test_audit_attacks_a_lora_client():
    """`gradleak.audit` with a LoRA training spec: the client sends only its adapters, and
    DAGER still copies the batch through them (a rank below its margin is skipped with why)."""
    import gradleak
    from gradleak.fl import TrainingSpec

    result = gradleak.audit(SMALL_GPT2, "news", attacks=["dager"], training=TrainingSpec(lora_rank=40),
                            batch_size=2, seq_len=4, lpips="none")
    assert result.runs[0].spec.lora == 40 and result.runs[0].metrics["exact_sequence_accuracy"] == 1.0
    small = gradleak.audit(SMALL_GPT2, "news", attacks=["dager"], training=TrainingSpec(lora_rank=16),
                           batch_size=2, seq_len=4, lpips="none")
    assert not small.runs and "leaves no room for a span" in small.skipped[0].reason


SWEEP = """
name: text-defenses
defaults: {seq_len: 8}
grids:
  - datasets: [news]
    models: ["gpt2:width=96,heads=2"]
    batch_sizes: [2]
    local_steps: [1]
    seeds: [0, 1]
    defenses: [none, "noise:sigma=0.1"]
    attacks: [dager]
"""


def test_a_sweep_over_defenses_gives_text_verdicts_and_a_report(tmp_path, capsys):
    """Text through the store and the report: per-sequence scores stored as numbers, the
    sentences beside their recovery on the page, and a verdict per defense in words."""
    from gradleak.report import write_report
    from gradleak.store import ResultStore

    spec = tmp_path / "text.yaml"
    spec.write_text(SWEEP)
    assert main(["sweep", str(spec), "--store", str(tmp_path / "s.db"), "--workers", "1", "--json"]) == 0
    capsys.readouterr()
    with ResultStore(tmp_path / "s.db", create=False) as store:
        cells = store.cells("attack")
        grid = [c for c in cells if not c.labels.get("sample_rung")]  # the rest: the sample ladder's
        assert len(grid) == 4 and all(len(store.images(c.key)) == 2 for c in grid)
        assert all(len(c.extras["sequences"]) == 2 for c in grid)
    result = write_report(tmp_path / "s.db", tmp_path / "report")
    verdicts = {e["defense"]: (e["verdict"], e["verdict_text"]) for e in result["strongest"]}
    assert verdicts["none"] == ("leaks", "leaks: 4 of 4 examples copied exactly (token for token) by dager")
    # noise σ = 0.1 on a gradient whose entries are ~1e-3: DAGER's span test finds nothing
    # (measured over seeds 0-3: ROUGE-1 0.0, none re-identified among 1,000 sequences)
    assert verdicts["noise"][0] == "holds", verdicts["noise"]
    page = (tmp_path / "report" / "index.html").read_text()
    assert result["texts"] >= 4 and page.count("(exact)") >= 4 and "best ROUGE-1" in page


def test_scores_decode_with_the_data_s_own_tokenizer():
    """WordPiece rows are scored on WordPiece text (not read as GPT-2 ids), padding [PAD] = 0
    left out; token ids of an unknown vocabulary are compared as ids."""
    result = run_attack(AttackRunSpec(dataset="polarity:tokenizer=minilm", model="minilm", attack="dager",
                                      batch_size=2, seq_len=16, seed=0, lpips="none"))
    first = result.per_example[0]
    assert result.metrics["rouge1"] == 1.0 and result.metrics["token_accuracy"] == 1.0
    assert first["original"] == first["recovered"] and first["original"].islower()
    assert "[" not in first["original"] and len(first["original"].split()) >= 5
    from gradleak.data.text import decode, pad_token_of

    assert pad_token_of("minilm") == 0 and pad_token_of(None) is None
    assert decode(torch.tensor([7, 8, 0, 0]), pad_token_of("minilm"), None) == "7 8"
    with pytest.raises(GradleakError, match="unknown tokenizer"):
        from gradleak.data.tensors import dataset_from_tensors

        dataset_from_tensors(torch.ones(2, 3, dtype=torch.long), torch.tensor([0, 1]), tokenizer="bpe")
