"""The pretrained encoder `minilm` (all-MiniLM-L6-v2 in plain PyTorch), polarity's WordPiece
tokenizer (`polarity:tokenizer=minilm`) and DAGER's encoder search, on the real weights and data."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from gradleak.attacks.text.dager_encoder import encoder_search
from gradleak.cli import main
from gradleak.data import DatasetSpec, load_dataset
from gradleak.data import text as text_data
from gradleak.errors import GradleakError
from gradleak.models import ModelSpec, build_model
from gradleak.models.minilm import CLS_ID, PAD_ID, SEP_ID, MiniLM, load_pretrained

SEQ_LEN = 16


@pytest.fixture(scope="module")
def polarity():
    return load_dataset(DatasetSpec("polarity", seq_len=SEQ_LEN, options={"tokenizer": "minilm"}))


@pytest.fixture(scope="module")
def minilm():
    return build_model(ModelSpec("minilm", (SEQ_LEN,), 2))


def cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["attack", *args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_every_weight_is_read_by_name_with_its_shape():
    model = MiniLM(classes=2)
    before = model.classifier.weight.clone()
    unused = load_pretrained(model)
    # the pooler only serves pool=cls; position_ids is a buffer of 0..511
    assert unused == ["embeddings.position_ids", "pooler.dense.bias", "pooler.dense.weight"]
    assert torch.equal(model.classifier.weight, before)  # the head keeps its seeded init
    assert sum(p.numel() for p in model.parameters()) == 22_566_146  # 22.7 M less the pooler, plus the head
    with_pooler = MiniLM(classes=2, pool="cls")
    assert load_pretrained(with_pooler) == ["embeddings.position_ids"]


def test_sentence_embeddings_match_the_published_similarity(minilm):
    # all-MiniLM-L6-v2's model card (sentence-transformers) reports 0.7553 for this pair
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed today."]
    ids = [text_data.encode(s, "minilm") for s in sentences]
    tokens = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)
    for row, seq in enumerate(ids):
        tokens[row, :len(seq)] = torch.tensor(seq)
    with torch.no_grad():
        embedding = minilm.sentence_embedding(tokens)
        alone = minilm.sentence_embedding(tokens[:1, :len(ids[0])])  # padding changes nothing
    cosine = embedding @ embedding.T
    assert cosine[0, 1] == pytest.approx(0.7553, abs=1e-3)
    assert cosine[0, 2] < 0.1 and cosine[1, 2] < 0.1
    assert torch.allclose(alone[0], embedding[0], atol=1e-5)


def test_forward_embeddings_equals_forward_on_unpadded_input(minilm):
    tokens = torch.tensor([text_data.encode("a gorgeous, witty, seductive movie.", "minilm")])
    with torch.no_grad():
        assert torch.allclose(minilm(tokens), minilm.forward_embeddings(minilm.token_embedding(tokens)), atol=1e-5)


def test_random_init_is_seeded_and_differs_from_the_checkpoint(minilm):
    spec = ModelSpec("minilm", (SEQ_LEN,), 2, seed=3, options={"pretrained": "false", "layers": "2"})
    a, b = build_model(spec), build_model(spec)
    assert len(a.blocks) == 2 and torch.equal(a.token_embedding.weight, b.token_embedding.weight)
    assert not torch.equal(a.token_embedding.weight, minilm.token_embedding.weight)


def test_wordpiece_rows_round_trip(polarity):
    tokens = polarity.inputs
    assert tokens.shape == (160, SEQ_LEN) and tokens.dtype == torch.int64
    assert bool((tokens[:, 0] == CLS_ID).all()) and int(tokens.max()) < text_data.MINILM_VOCAB_SIZE
    for row in tokens:
        ids = row[row != PAD_ID].tolist()
        assert ids[-1] == SEP_ID and SEP_ID not in ids[:-1]
        assert bool((row[len(ids):] == PAD_ID).all())  # right padding only
        text = text_data.decode(row, PAD_ID, "minilm")
        if len(ids) < SEQ_LEN:  # a whole sentence: its lower-cased text encodes back to the same ids
            assert text_data.encode(text, "minilm") == ids
    # GPT-2 stays the default tokenizer
    assert int(load_dataset(DatasetSpec("polarity", seq_len=SEQ_LEN)).inputs.max()) == text_data.PAD_TOKEN


@pytest.mark.parametrize("args, message", [
    (("--dataset", "polarity", "--model", "minilm", "--attack", "dager"),
     "minilm reads WordPiece ids 0..30521, got id 50256"),
    (("--dataset", "polarity:tokenizer=minilm", "--model", "minilm", "--attack", "tag"),
     "tag needs gradleak's GPT-2"),
    (("--dataset", "polarity:tokenizer=minilm", "--model", "minilm", "--attack", "lamp"),
     "lamp needs gradleak's GPT-2"),
    (("--dataset", "polarity:tokenizer=minilm", "--model", "minilm", "--attack", "ig"),
     "attack 'ig' does not handle text data"),
    (("--dataset", "polarity:tokenizer=bpe", "--model", "minilm", "--attack", "dager"),
     "tokenizer 'bpe' unknown; choose from: gpt2, minilm"),
    (("--dataset", "news:tokenizer=minilm", "--model", "gpt2", "--attack", "dager"),
     "dataset 'news': tokenizer 'minilm' unknown"),
    (("--dataset", "polarity:tokenizer=minilm", "--model", "minilm:layers=1", "--attack", "dager"),
     "dager on minilm needs at least 2 blocks"),
    (("--dataset", "polarity:tokenizer=minilm", "--model", "minilm", "--attack", "dager", "--activation", "relu"),
     "has BERT's GELU"),
    (("--dataset", "polarity:tokenizer=minilm", "--model", "minilm", "--attack", "dager", "--seq-len", "600"),
     "allowed with tokenizer=minilm: 2 to 512 tokens"),
    (("--dataset", "polarity:tokenizer=minilm", "--model", "minilm", "--attack", "dager", "--local-steps", "2",
      "--optimizer", "adam"),
     "attack 'dager' reads a FedAvg delta as a sum of gradients: the client's optimizer 'adam'"),
    (("--dataset", "polarity:tokenizer=minilm", "--model", "minilm", "--attack", "dager", "--lora", "4"),
     "dager: a LoRA adapter of rank 4 with zero B leaves no room for a span"),
])
def test_mismatches_are_refused_in_one_line(capsys, args, message):
    code, out, err = cli(capsys, *args, "--json")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_gpt2_ids_that_fit_the_vocabulary_are_still_refused(minilm):
    with pytest.raises(GradleakError, match="start with \\[CLS\\]"):
        minilm(torch.tensor([[464, 3290, 318, 257]]))  # GPT-2's "The movie is a"


def _recover(model, data, batch_size: int, seed: int):
    index = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:batch_size]
    x, y = data.inputs[index], data.labels[index]
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    result = encoder_search(model, gradients, batch_size, SEQ_LEN)
    rows = {tuple(r) for r in result.tokens.tolist()}
    return sum(tuple(r) in rows for r in x.tolist()) / batch_size, result


@pytest.mark.parametrize("batch_size, seeds", [(1, range(3)), (2, range(3))])
def test_dager_recovers_small_batches_exactly(minilm, polarity, batch_size, seeds):
    # measured: batch 1 and 2 × 16 tokens, seeds 0-9: every sentence exact, every row flagged exact
    for seed in seeds:
        recovered, result = _recover(minilm, polarity, batch_size, seed)
        assert recovered == 1.0 and bool(result.exact.all()), seed


def test_dager_recovers_a_batch_of_four(minilm, polarity):
    # measured: batch 4 × 16 tokens, seeds 0-9: 40 of 40 sentences exact (the coordinate search
    # misses sentences with fewer random starts); seed 1 takes about 15 s on one thread
    recovered, result = _recover(minilm, polarity, 4, 1)
    assert recovered == 1.0 and bool(result.exact.all())


def test_dager_on_minilm_through_the_cli(capsys):
    code, out, err = cli(capsys, "--dataset", "polarity:tokenizer=minilm", "--model", "minilm", "--attack", "dager",
                         "--batch-size", "2", "--seq-len", str(SEQ_LEN), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["metrics"]["exact_sequence_accuracy"] == 1.0 and result["metrics"]["examples"] == 2
    assert result["extras"]["exact_rows"] == [2]  # per attacked batch
