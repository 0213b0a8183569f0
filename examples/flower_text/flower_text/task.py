"""The model, the clients' text and the local training of this Flower app.

A small GPT-2-style language model (gradleak's `gpt2`: 2 blocks, width 128, 4 heads, GPT-2's
50,257-token vocabulary) learns next-token prediction on news articles (the Lee corpus,
read offline by gradleak's loader, in windows of `seq-len` tokens). Every client holds
`sequences-per-client` windows of the train split and, in each round, runs `local-epochs`
passes of plain SGD over them in mini-batches of `batch-size`. With `lora-rank` > 0 the
clients fine-tune LoRA adapters of that rank on the attention projections instead (the base
model frozen), and the server sends and averages only the adapters.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch.utils.data import DataLoader, TensorDataset

from gradleak.data import DatasetSpec, load_dataset
from gradleak.data.text import VOCAB_SIZE
from gradleak.models import ModelSpec, build_model
from gradleak.models.gpt2 import language_model_loss
from gradleak.models.lora import apply_lora

SEQ_LEN = 16  # the run config's seq-len; the model's shapes are fixed at this length
OPTIONS = {"layers": 2, "width": 128, "heads": 4}


def Net(seed: int = 0) -> torch.nn.Module:  # noqa: N802 - the app's model, named as Flower examples name it
    return build_model(ModelSpec("gpt2", (SEQ_LEN,), VOCAB_SIZE, seed=seed, options=OPTIONS))


def client_model(config: Mapping[str, Any]) -> torch.nn.Module:
    """The model a client trains: Net(), with LoRA adapters of rank `lora-rank` (drawn from
    `seed`) when that is > 0."""
    rank = int(config["lora-rank"])
    return apply_lora(Net(), rank, seed=int(config["seed"])) if rank else Net(int(config["seed"]))


def sent_arrays(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What the server and the clients exchange: the whole state, or (LoRA) the adapters."""
    if all(p.requires_grad for p in model.parameters()):
        return model.state_dict()
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def client_data(partition_id: int, num_partitions: int, config: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """This client's sequences (token ids) and their next tokens, in its loader's order."""
    train = load_dataset(DatasetSpec("news", split="train", seq_len=int(config["seq-len"])))
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(int(config["seed"])))
    k = int(config["sequences-per-client"])
    keep = order[partition_id * k:(partition_id + 1) * k]
    return train.inputs[keep], train.labels[keep]


def held_out_sequences(count: int = 1000) -> torch.Tensor:
    """News test-split windows (no client trains on them)."""
    return load_dataset(DatasetSpec("news", split="test", seq_len=SEQ_LEN)).inputs[:count]


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, config: Mapping[str, Any]) -> float:
    """Plain SGD over the client's sequences in a fixed order; returns the last batch's loss."""
    loader = DataLoader(TensorDataset(x, y), batch_size=int(config["batch-size"]), shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
    loss = torch.tensor(0.0)
    for _ in range(int(config["local-epochs"])):
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = language_model_loss(model(inputs), labels)
            loss.backward()
            optimizer.step()
    return float(loss.detach())
