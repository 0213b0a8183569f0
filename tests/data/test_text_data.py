"""Text data: the offline corpora and the GPT-2 tokenizer, read without importing their
carriers; token tensors of the user's own."""
from __future__ import annotations

import socket
import sys

import pytest
import torch

from gradleak.data import DatasetSpec, load_dataset
from gradleak.data import text as text_data
from gradleak.errors import GradleakError, InputFileError, OptionRangeError
from tests.support.text import EOT, VOCAB


def test_text_data_loads_offline_without_importing_the_carriers(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access while loading offline text data")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    text_data.gpt2_tokenizer.cache_clear()
    text_data.token_strings.cache_clear()
    news = load_dataset(DatasetSpec("news", seq_len=16))
    polarity = load_dataset(DatasetSpec("polarity", split="test"))
    assert news.modality == polarity.modality == "text"
    assert "gensim" not in sys.modules and "whisper" not in sys.modules


def test_news_windows_are_next_token_pairs_split_by_article():
    train = load_dataset(DatasetSpec("news", split="train", seq_len=16))
    test = load_dataset(DatasetSpec("news", split="test", seq_len=16))
    assert train.inputs.shape == (3412, 16) and test.inputs.shape == (834, 16)
    assert train.inputs.dtype == train.labels.dtype == torch.int64
    assert train.labels.shape == train.inputs.shape and train.num_classes == VOCAB
    assert torch.equal(train.labels[:, :-1], train.inputs[:, 1:])  # labels: the next token
    assert int(train.inputs.max()) < EOT  # no special token inside news text
    default = load_dataset(DatasetSpec("news", split="test"))
    assert default.inputs.shape[1] == text_data.NEWS_SEQ_LEN
    again = load_dataset(DatasetSpec("news", split="train", seq_len=16))
    assert torch.equal(again.inputs, train.inputs)  # deterministic
    assert set(text_data.article_split(293, "train")).isdisjoint(text_data.article_split(293, "test"))
    assert len(text_data.article_split(293, "test")) == 59
    # verbatim repeats are dropped before the split; one story told twice with the same
    # opening still puts 7 identical windows on both sides
    train_rows = {tuple(r) for r in train.inputs.tolist()}
    assert sum(tuple(r) in train_rows for r in test.inputs.tolist()) == 7


def test_polarity_sentences_padded_with_end_of_text():
    train = load_dataset(DatasetSpec("polarity", split="train", seq_len=24))
    test = load_dataset(DatasetSpec("polarity", split="test", seq_len=24))
    assert train.inputs.shape == (160, 24) and test.inputs.shape == (40, 24)
    assert train.class_names == ["negative", "positive"]
    assert train.labels.bincount().tolist() == [80, 80] and test.labels.bincount().tolist() == [20, 20]
    padded = test.inputs == EOT
    assert padded.any()
    # padding only on the right: once a row is padded it stays padded
    assert torch.equal(padded, padded.long().cummax(dim=1).values.bool())
    text = text_data.decode(test.inputs[0])
    assert text and not text.endswith("<|endoftext|>")
    assert torch.equal(load_dataset(DatasetSpec("polarity", split="test", seq_len=24)).inputs, test.inputs)
    # the file is Windows-1252 (é, an em dash); 64 tokens hold every sentence (the longest has 56)
    whole = load_dataset(DatasetSpec("polarity", split="train", seq_len=64))
    texts = [text_data.decode(row) for row in whole.inputs]
    assert "the action clichés just pile up ." in texts and any("bender — and" in t for t in texts)


def test_sequence_length_is_checked():
    with pytest.raises(OptionRangeError, match="seq_len = 0"):
        load_dataset(DatasetSpec("news", seq_len=0))
    with pytest.raises(OptionRangeError, match="1 to 1024"):
        load_dataset(DatasetSpec("polarity", seq_len=5000))
    with pytest.raises(GradleakError, match="choose a shorter seq_len"):
        load_dataset(DatasetSpec("news", split="test", seq_len=1000))  # the longest article has 761 tokens
    with pytest.raises(GradleakError, match="takes no path"):
        load_dataset(DatasetSpec("news", path="/tmp"))


def test_tokenizer_round_trips_text():
    tokenizer = text_data.gpt2_tokenizer()
    assert tokenizer.n_vocab == VOCAB
    assert tokenizer.encode_ordinary("Hello world") == [15496, 995]  # GPT-2's own ids
    for sample in ("Hundreds of people have been forced to vacate their homes.",
                   "  leading and trailing spaces \n\n tabs\tand newlines ",
                   "naïve café — ümlaut, 日本語, emoji 🙂", "<|endoftext|> is plain text here", "'s 'll 've 42 3.14"):
        ids = tokenizer.encode_ordinary(sample)
        assert tokenizer.decode(ids) == sample
        assert text_data.decode(ids + [EOT, EOT]) == sample  # right padding dropped
    assert text_data.token_strings()[15496] == "Hello"


def test_rank_file_is_verified(tmp_path):
    forged = tmp_path / "gpt2.tiktoken"
    forged.write_bytes(b"IQ== 0\nIg== 1\n")
    with pytest.raises(InputFileError, match="SHA-256"):
        text_data._read_ranks(forged)


def test_user_token_tensors_are_text_data():
    from gradleak.data.tensors import dataset_from_tensors

    inputs = torch.randint(0, 100, (3, 5))
    data = dataset_from_tensors(inputs, torch.randint(0, 100, (3, 5)), num_classes=VOCAB)
    assert data.modality == "text" and data.input_shape == (5,) and data.num_classes == VOCAB
    assert dataset_from_tensors(inputs, torch.tensor([0, 1, 1])).modality == "text"  # a classifier's labels
    with pytest.raises(GradleakError, match="one next token per position"):
        dataset_from_tensors(inputs, torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(GradleakError, match="token ids must be >= 0"):
        dataset_from_tensors(inputs - 200, torch.tensor([0, 1, 1]))
    with pytest.raises(GradleakError, match="image inputs must be float"):  # only (N, T) integers are tokens
        dataset_from_tensors(torch.randint(0, 2, (3, 8, 8)), torch.tensor([0, 1, 1]))
