"""Text scores: ROUGE and exact rows with padding left out, the token-overlap distance, and
re-identification of recovered sentences by their words."""
from __future__ import annotations

import pytest
import torch

from gradleak.data import text as text_data
from gradleak.metrics.text import rouge, score_text
from tests.support.text import EOT, VOCAB, batch


def test_text_scores_match_rows_and_ignore_padding():
    tokenizer = text_data.gpt2_tokenizer()
    sentences = ["the storm cut power to homes", "a fire burned near the town", "rain fell across the state"]
    rows = [tokenizer.encode_ordinary(s) for s in sentences]
    length = max(map(len, rows)) + 2
    originals = torch.tensor([r + [EOT] * (length - len(r)) for r in rows])
    shuffled = originals[[2, 0, 1]]
    score = score_text(originals, shuffled)
    assert (score.rouge1, score.rouge2, score.rougeL) == (1.0, 1.0, 1.0)
    assert score.token_accuracy == score.exact_sequence_accuracy == 1.0
    assert score.assignment == [1, 2, 0]
    assert set(score.to_dict()) >= {"rouge1", "rouge2", "rougeL", "token_accuracy", "exact_sequence_accuracy"}
    wrong = originals.clone()
    wrong[0, 0] = tokenizer.encode_ordinary(" a")[0]  # "the" → "a": one of six words
    partial = score_text(originals, wrong, match_on="tokens")
    assert partial.exact_sequence_accuracy == pytest.approx(2 / 3)
    assert partial.token_accuracy == pytest.approx((1 - 1 / len(rows[0]) + 2) / 3)  # padding not counted
    expected = rouge("a storm cut power to homes", sentences[0])["rouge1"]
    assert expected == pytest.approx(5 / 6)
    assert partial.per_sequence[0]["rouge1"] == pytest.approx(expected)
    missing = score_text(originals, originals[:1])
    assert missing.assignment[1:] == [-1, -1] and missing.rouge1 == pytest.approx(1 / 3)


def test_token_overlap_distance_is_a_bag_of_tokens_f_measure():
    from gradleak.metrics.reidentify import token_overlap_distance

    pad = text_data.PAD_TOKEN
    sequence = torch.tensor([5, 6, 7, 7, pad, pad])
    others = torch.tensor([[7, 7, 6, 5, pad, pad],  # the same bag, shuffled
                           [5, 9, 9, 9, pad, pad],  # one token of four in common
                           [8, 8, 8, 8, 8, 8],  # nothing in common
                           [pad] * 6])  # nothing at all
    distance = token_overlap_distance(sequence, others, pad)
    assert distance.tolist() == pytest.approx([0.0, 1 - 2 * 1 / 8, 1.0, 1.0])
    # without a padding token every id counts
    assert float(token_overlap_distance(sequence, others[:1], None)[0]) == pytest.approx(0.0)


def test_text_recoveries_are_re_identified_by_their_words_not_their_order(news):
    """A recovery holding its original's tokens in another order points back to it among the
    train split's sequences; one holding random tokens does not (chance 1 / (gallery + 1))."""
    from gradleak.data.references import dataset_spec
    from gradleak.metrics.text import score_sequences
    from gradleak.run.scenario.gallery import split_gallery

    inputs, labels = batch(news[16], 4, seed=0)
    gallery = split_gallery(dataset_spec("news", "train", None))
    assert gallery.inputs.shape[1] == inputs.shape[1] and len(gallery) >= 500
    shuffled = inputs[:, torch.randperm(inputs.shape[1], generator=torch.Generator().manual_seed(1))]
    scores, _ = score_sequences(inputs, labels, shuffled, None, gallery=gallery)
    assert all(s.identified for s in scores) and scores[0].reid_chance == pytest.approx(1 / (len(gallery) + 1))
    assert max(s.rouge2 for s in scores) < 0.5  # the order is lost, the sentence is not
    noise = torch.randint(0, VOCAB, inputs.shape, generator=torch.Generator().manual_seed(2))
    scores, _ = score_sequences(inputs, labels, noise, None, gallery=gallery)
    assert not any(s.identified for s in scores)
