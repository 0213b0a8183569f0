"""The GPT-2 model: shapes, heads and options, causality, and the block extension DAGER uses."""
from __future__ import annotations

import pytest
import torch

from gradleak.errors import GradleakError
from gradleak.models.base import ModelSpec
from gradleak.models.building import build
from gradleak.models.gpt2 import build_gpt2
from tests.support.text import VOCAB, gpt2


def test_gpt2_shapes_heads_and_options():
    model = gpt2(16)
    tokens = torch.randint(VOCAB, (3, 16), generator=torch.Generator().manual_seed(0))
    assert model(tokens).shape == (3, 16, VOCAB)
    assert model.lm_head.weight is model.token_embedding.weight  # tied, as GPT-2
    width, layers = 128, 2
    per_block = 12 * width * width + 13 * width  # qkv, proj, mlp weights and biases, two layer norms
    assert sum(p.numel() for p in model.parameters()) == (VOCAB + 1024) * width + layers * per_block + 2 * width
    untied = gpt2(16, tied=False)
    assert untied.lm_head.weight is not untied.token_embedding.weight
    classifier = gpt2(16, classes=2)
    assert classifier(tokens).shape == (3, 2)
    with pytest.raises(GradleakError, match="head=classifier"):
        gpt2(16, classes=2, head="lm")
    with pytest.raises(GradleakError, match="multiple of heads"):
        gpt2(16, width=100, heads=3)
    with pytest.raises(GradleakError, match="token sequences"):
        build(ModelSpec("gpt2", (3, 32, 32), 10), build_gpt2)
    with pytest.raises(GradleakError, match="exceed positions"):
        gpt2(64, positions=32)
    with pytest.raises(GradleakError, match="integer token ids"):
        model(torch.rand(2, 16))
    default = build(ModelSpec("gpt2", (16,), VOCAB), build_gpt2)
    assert (default.width, default.heads, len(default.blocks)) == (384, 6, 2)
    same = gpt2(16)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))  # seeded
    assert not torch.equal(gpt2(16, seed=1).token_embedding.weight, model.token_embedding.weight)


def test_gpt2_is_causal():
    model = gpt2(12, vocab=500, classes=500)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(500, (2, 12), generator=gen)
    changed = tokens.clone()
    changed[:, 7:] = torch.randint(500, (2, 5), generator=gen)
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :7], before[:, :7], rtol=0, atol=0)
    assert not torch.allclose(after[:, 7:], before[:, 7:])


def test_block_extend_matches_the_full_forward():
    model = gpt2(10, vocab=300, classes=300, width=32, heads=4)
    block = model.blocks[0]
    tokens = torch.randint(300, (3, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        x = model.embed(tokens)
        full = block(x)
        keys = values = x.new_zeros(3, 4, 0, 8)
        for p in range(10):  # incremental decoding, one position at a time
            out, k, v = block.extend(x[:, p:p + 1], keys, values)
            torch.testing.assert_close(out[:, 0], full[:, p], rtol=1e-5, atol=1e-6)
            keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        # m alternatives for position 5, shared by every prefix, each seeing only its own prefix
        other = model.embed(torch.randint(300, (1, 6), generator=torch.Generator().manual_seed(3)))[:, 5:6]
        alternatives = torch.cat([other, x[:1, 5:6], x[1:2, 5:6]], dim=1)  # (1, 3, D)
        out, _, _ = block.extend(alternatives, keys[:, :, :5], values[:, :, :5])
        for prefix in range(3):
            for alt in range(3):
                sequence = torch.cat([x[prefix:prefix + 1, :5], alternatives[:, alt:alt + 1]], dim=1)
                torch.testing.assert_close(out[prefix, alt], block(sequence)[0, 5], rtol=1e-5, atol=1e-6)
