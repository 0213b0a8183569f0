"""gradleak.flower's hook on stand-in Flower replies (no simulation), and the check it runs
on every captured update: the declared training, replayed on the ground truth, must
reproduce it (gradleak.api.check_declared_training)."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, MetricRecord  # noqa: E402

from gradleak.analysis import verdict  # noqa: E402
from gradleak.api import TrainingMismatchWarning, audit_update, check_declared_training  # noqa: E402
from gradleak.errors import GradleakError  # noqa: E402
from gradleak.fl import TrainingSpec, Update  # noqa: E402
from gradleak.flower import FlowerAudit  # noqa: E402
from gradleak.flower.messages import received_update  # noqa: E402
from gradleak.flower.truth import write_truth  # noqa: E402

MOMENTUM = "sgd:momentum=0.9,weight_decay=0.0005"
ATTACK = "dlg:iterations=2"  # the attack is not what these tests look at: the cheapest one


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Sigmoid(), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 3))


def _examples(count: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.rand(count, 1, 8, 8, generator=generator), torch.randint(0, 3, (count,), generator=generator)


def _client_trains(model: nn.Module, x, y, *, lr: float, epochs: int, batch_size: int, seed: int,
                   momentum: float = 0.9, weight_decay: float = 5e-4) -> dict[str, torch.Tensor]:
    """A client as a PyTorch app trains: a seeded shuffling DataLoader and torch.optim.SGD."""
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    model.train()
    for _ in range(epochs):
        for inputs, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _reply(state: dict[str, torch.Tensor], samples: int, node: int = 7):
    """What the hook reads of a Flower reply: its one array record, metrics and sender."""
    content = SimpleNamespace(array_records={"arrays": ArrayRecord(state)},
                              metric_records={"metrics": MetricRecord({"num-examples": samples})})
    return SimpleNamespace(content=content, metadata=SimpleNamespace(src_node_id=node), has_error=lambda: False)


def _momentum_update(epochs: int = 2, batch_size: int = 4, seed: int = 5):
    x, y = _examples()
    model = _bn_net()
    sent = {k: v.clone() for k, v in model.state_dict().items()}
    returned = _client_trains(model, x, y, lr=0.05, epochs=epochs, batch_size=batch_size, seed=seed)
    update = received_update(_bn_net(), sent, _reply(returned, len(x)), TrainingSpec(lr=0.05), len(x))
    return x, y, update, returned


def test_the_reply_buffers_reach_the_update():
    """A Flower client returns its whole state dict: the batch-norm buffers travel with the update."""
    x, _, update, returned = _momentum_update()
    assert set(update.buffers) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert set(update.tensors) == {n for n, _ in _bn_net().named_parameters()}
    for name, tensor in update.buffers.items():
        assert torch.equal(tensor, returned[name])
    assert int(update.buffers["1.num_batches_tracked"]) == 2 * 3  # 2 epochs of 3 batches


def test_audit_round_confirms_a_shuffled_momentum_client(tmp_path):
    """The hook derives each client's shuffling seed by the app's rule, marks that the client
    sends buffers, and the declared training reproduces the captured update."""
    x, y = _examples()
    rule = lambda config, server_round, client: int(config["seed"]) * 1000 + server_round * 10 + client  # noqa: E731
    config = {"lr": 0.05, "momentum": 0.9, "weight-decay": 5e-4, "epochs": 2, "batch-size": 4, "seed": 3}
    audit = FlowerAudit(model_fn=_bn_net, ground_truth=lambda c, m: None, out=str(tmp_path), attacks=[ATTACK],
                        lpips="none", shuffle_seed_rule=rule,
                        training_keys={"lr": "lr", "momentum": "momentum", "weight_decay": "weight-decay",
                                       "local_epochs": "epochs", "local_batch_size": "batch-size"})
    model = _bn_net()
    sent = {k: v.clone() for k, v in model.state_dict().items()}
    returned = _client_trains(model, x, y, lr=0.05, epochs=2, batch_size=4, seed=rule(config, 2, 4))
    write_truth(audit.truth_path(2, 7), x, y, partition=4)
    audit.audit_round(2, sent, [_reply(returned, len(x))], audit.training_from(config), config)
    (captured,) = audit.captured
    assert captured.training.shuffle_seed == 3024 and captured.training.sends_buffers
    assert captured.training.optimizer == MOMENTUM
    check = captured.training_check
    # measured: 4e-7 of the update's largest entry (float32 rounding)
    assert check.confirmed and check.difference <= 1e-5, check


def test_a_misdeclared_optimizer_warns_and_no_holds_follows():
    """Declaring plain SGD for a momentum client: a warning with the measured difference, the
    result and its stored rows say so, and the setting's verdict cannot be `holds`."""
    x, y, update, _ = _momentum_update()
    declared = TrainingSpec(lr=0.05, local_epochs=2, local_batch_size=4, shuffle_seed=5)  # plain SGD
    with pytest.warns(TrainingMismatchWarning, match=r"differs from the captured one by [0-9.e+-]+ of its largest"):
        result = audit_update(_bn_net(), update, x, y, training=declared, attacks=[ATTACK], lpips="none")
    assert result.training_check.confirmed is False and result.training_check.difference > 0.1
    assert "training not confirmed" in result.summary()
    (record,) = result.records()
    assert record.extras["training_check"]["confirmed"] is False
    assert result.verdicts()[0]["verdict"] == "not shown (training not confirmed)"
    # declared as the client trained: no warning, and the check is recorded as confirmed
    right = TrainingSpec(lr=0.05, local_epochs=2, local_batch_size=4, shuffle_seed=5, optimizer=MOMENTUM)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingMismatchWarning)
        result = audit_update(_bn_net(), update, x, y, training=right, attacks=[ATTACK], lpips="none")
    assert result.training_check.confirmed
    assert result.verdicts()[0]["verdict"] != "not shown (training not confirmed)"


@pytest.mark.parametrize("wrong", [dict(local_epochs=1), dict(shuffle_seed=6), dict(shuffle_seed=None),
                                   dict(optimizer="sgd:momentum=0.9")])
def test_each_misdeclaration_is_caught(wrong):
    """Epochs, the shuffling seed, no shuffling, and weight decay left out (the subtlest)."""
    x, y, update, _ = _momentum_update()
    fields = {"lr": 0.05, "local_epochs": 2, "local_batch_size": 4, "shuffle_seed": 5, "optimizer": MOMENTUM}
    check = check_declared_training(_bn_net(), update, x, y, TrainingSpec(**{**fields, **wrong}))
    assert check.checked and check.confirmed is False, check


def test_what_the_auditor_cannot_replay_is_not_checked():
    x, y, update, _ = _momentum_update()
    declared = TrainingSpec(lr=0.05, local_epochs=2, local_batch_size=4, shuffle_seed=5, optimizer=MOMENTUM)
    for check in (check_declared_training(_bn_net(), update, x, y, declared, defenses=("noise:sigma=0.01",)),
                  check_declared_training(_bn_net(), update.replace(clients=3), x, y, declared)):
        assert not check.checked and check.confirmed is None and check.note


def test_verdict_needs_a_confirmed_training():
    entry = {"grade": None, "failed": 0, "unsaturated": None, "reid_judged": True, "seeds": 2,
             "meets_tolerance": True, "min_examples": 40, "worst_linkage_high": 0.55, "worst_recognizable_high": 0.08,
             "attack_specs": ["ig"], "budget_min": 100, "budget_max": 100}
    assert verdict(entry)[0] == "holds"
    assert verdict({**entry, "training_unconfirmed": 1})[0] == "not shown (training not confirmed)"


def test_training_keys_take_the_optimizer_options_of_a_run_config():
    def declared(keys: dict, config: dict) -> TrainingSpec:
        return FlowerAudit(model_fn=_bn_net, ground_truth=lambda c, m: None, training_keys=keys).training_from(config)

    training = declared({"lr": "lr", "momentum": "momentum", "weight_decay": "wd", "nesterov": "nesterov"},
                        {"lr": 0.1, "momentum": 0.9, "wd": 5e-4, "nesterov": True})
    assert (training.optimizer_name, training.optimizer_options.momentum) == ("sgd", 0.9)
    assert training.optimizer_options.nesterov and training.optimizer_options.weight_decay == 5e-4
    training = declared({"lr": "lr", "optimizer": "opt", "beta2": "b2"}, {"lr": 0.1, "opt": "adam", "b2": 0.99})
    assert (training.optimizer_name, training.optimizer_options.beta2) == ("adam", 0.99)
    with pytest.raises(GradleakError, match="beta1"):
        declared({"lr": "lr", "beta1": "b1"}, {"lr": 0.1, "b1": 0.8})  # plain SGD has no beta1
    with pytest.raises(GradleakError, match="shuffle_seed_rule"):
        FlowerAudit(model_fn=_bn_net, ground_truth=lambda c, m: None, shuffle_seed_rule=lambda c, r, k: 0,
                    training_keys={"lr": "lr", "shuffle_seed": "seed"})


def test_update_without_buffers_when_the_reply_has_none():
    model = nn.Linear(3, 2)
    sent = {k: v.clone() for k, v in model.state_dict().items()}
    update = received_update(model, sent, _reply(sent, 4), TrainingSpec(), 4)
    assert update.buffers == {} and isinstance(update, Update)


def test_lora_keys_and_adapter_arrays():
    """A run config's lora_rank (0: full fine-tuning) declares LoRA clients; the arrays the server
    sends may then be the adapters alone, and the update holds just those. Adapter arrays for a
    model the audit does not adapt are refused in one line that says what to declare."""
    from gradleak.flower.messages import load_sent_state
    from gradleak.models.gpt2 import GPT2
    from gradleak.models.lora import apply_lora

    def declared(config: dict) -> TrainingSpec:
        return FlowerAudit(model_fn=_bn_net, ground_truth=lambda c, m: None,
                           training_keys={"lr": "lr", "lora_rank": "rank", "lora_alpha": "alpha"}).training_from(config)

    assert declared({"lr": 0.1, "rank": 0, "alpha": 16}).lora_rank is None
    training = declared({"lr": 0.1, "rank": 8, "alpha": 16})
    assert (training.lora_rank, training.lora_alpha) == (8, 16.0)

    torch.manual_seed(0)
    adapted = apply_lora(GPT2(vocab=64, positions=8, layers=1, width=16, heads=2), 8, seed=1)
    adapters = {n: p.detach() + 0.5 for n, p in adapted.named_parameters() if p.requires_grad}
    model = training.prepare_model(GPT2(vocab=64, positions=8, layers=1, width=16, heads=2), 0)
    model.load_state_dict(adapted.state_dict())  # the same base weights
    load_sent_state(model, adapters)
    assert torch.equal(model.blocks[0].attn.qkv.lora_A, adapters["blocks.0.attn.qkv.lora_A"])
    returned = {n: t - 0.25 for n, t in adapters.items()}
    update = received_update(model, adapters, _reply(returned, 2), training, 2)
    assert set(update.tensors) == set(adapters)
    assert all(torch.allclose(t, torch.full_like(t, 0.25)) for t in update.tensors.values())
    with pytest.raises(GradleakError, match="declare lora_rank in training_keys"):
        load_sent_state(GPT2(vocab=64, positions=8, layers=1, width=16, heads=2), adapters)
    with pytest.raises(GradleakError, match="do not fit model_fn's model"):  # a trainable array missing
        load_sent_state(model, {k: v for k, v in adapters.items() if not k.endswith("lora_B")})
