"""What a threat model can grant the server, and the presets (`gradleak.threat` builds
threat models from them; the analysis reads them to tell which threat models include
which, without loading torch)."""
from __future__ import annotations

# Every piece of knowledge a threat model can grant, with what it means.
KNOWLEDGE: dict[str, str] = {
    "batch_size": "how many examples the client trained on",
    "local_training": "the client's learning rate, local steps/epochs and local batch size",
    "defenses": "which defenses (with parameters) the client applies",
    "labels": "the ground-truth labels of the client's batch",
    # also seen, under any threat model, in the BN buffers a client sends after one local step
    # (gradleak.fl.buffers)
    "bn_statistics": "the batch-norm mean/variance of the client's batch at every BN layer",
    "prior_data": "held-out examples from the client's data distribution",
    "malicious_model": "the server may modify the model it sends before the client trains",
}

# Presets. "honest" is the honest-but-curious server of the gradient-inversion
# literature: it chose the training protocol, so it knows batch size, local
# hyper-parameters and the defenses, but nothing about the data.
PRESETS: dict[str, frozenset[str]] = {
    "honest": frozenset({"batch_size", "local_training", "defenses"}),
    "informed": frozenset({"batch_size", "local_training", "defenses", "labels", "bn_statistics",
                           "prior_data"}),
    "malicious": frozenset({"batch_size", "local_training", "defenses", "malicious_model"}),
}


def granted(label: str) -> frozenset[str] | None:
    """The knowledge of a threat model named as `gradleak.threat.make_threat_model` names it
    ("honest", "informed+labels", ...); None for a name that is not one."""
    preset, *extra = str(label).split("+")
    if preset not in PRESETS or any(k not in KNOWLEDGE for k in extra):
        return None
    return PRESETS[preset] | frozenset(extra)
