"""The `dager` attack (Petrov, Dimitrov, Baader, Müller, Vechev, NeurIPS 2024): one attack for
decoders (gradleak.attacks.text.dager: FedSGD, FedAvg, LoRA) and encoders
(gradleak.attacks.text.dager_encoder), chosen by the model it attacks."""
from __future__ import annotations

import copy

from ...errors import GradleakError
from ...threat import Observation
from ..base import Attack, AttackContext, Reconstruction, check_result
from .dager import DagerOptions, check_architecture, dager_search
from .dager_encoder import check_encoder, is_encoder, reconstruct_encoder


class DAGER(Attack):
    """Exact recovery of a batch of token sequences from one FedSGD gradient or FedAvg delta of
    gpt2, or of its LoRA adapters.

    DAGER's span checks (see the module doc); analytic: more budget cannot change its result."""

    name = "dager"
    Options = DagerOptions
    handles_lora = True  # it reads a LoRA client's adapter tensors (see `_layer_spans`)
    requires = frozenset({"batch_size"})
    modalities = ("text",)

    def unsupported(self, model, input_shape, num_classes, modality):
        return (super().unsupported(model, input_shape, num_classes, modality)
                or check_result(lambda: check_encoder(model) if is_encoder(model) else check_architecture(model)))

    def reconstruct(self, obs: Observation, ctx: AttackContext) -> Reconstruction:
        update = obs.update
        if update.kind != "gradient":
            # FedAvg: a sum of gradients at moving weights; a server that knows the client ran
            # (momentum) SGD reads its span as DAGER does, at the weights it sent
            training = obs.training if obs.knows("local_training") else None
            if training is not None and (training.optimizer_name != "sgd"
                                         or training.optimizer_options.weight_decay):
                raise GradleakError("attack 'dager' reads a FedAvg delta as a sum of gradients: the client's "
                                    f"optimizer '{training.optimizer}' rescales or decays the weights, which "
                                    "breaks the span test; attack plain SGD (with momentum at most)")
        if is_encoder(obs.model):
            return reconstruct_encoder(obs, ctx, self.options)
        check_architecture(obs.model)
        batch_size, seq_len = obs.batch_size, int(obs.input_shape[0])
        model = copy.deepcopy(obs.model).to(ctx.device)
        result = dager_search(model, update.as_gradient(), batch_size, seq_len, self.options,
                              fedavg=update.kind != "gradient")
        extras = {"exact_rows": int(result.exact.sum()), "span_ranks": list(result.ranks),
                  "candidates_per_position": result.candidates}
        if result.saturated:
            limit = model.width - self.options.rank_margin
            extras["saturated"] = (f"the batch's {batch_size} × {seq_len} = {batch_size * seq_len} layer inputs "
                                   f"fill the {model.width}-wide model's span (DAGER needs fewer than width − "
                                   f"{self.options.rank_margin} = {limit}): no token can be told apart; attack a "
                                   "wider gpt2 (gpt2:width=N) or shorter sequences (--seq-len)")
        return Reconstruction(inputs=result.tokens.cpu(), labels=None, extras=extras)
