"""The optimisation engine every gradient-matching attack is a configuration of:
restarts one after another equal restarts optimised as a group, successive halving
stops the worse half, the stop rule and the trace, hooks and the exponential schedule,
and attack presets."""
import math

import pytest
import torch

from gradleak.attacks import AttackContext, make_attack
from gradleak.attacks.engine.candidates import FixedLabels, Pixels
from gradleak.attacks.engine.engine import Engine, Hook, Optimizer
from gradleak.attacks.engine.objectives import Matching, TotalVariation
from gradleak.errors import GradleakError
from gradleak.fl import TrainingSpec, compute_update
from gradleak.metrics import score_batch
from gradleak.models import ModelSpec, build_model
from gradleak.threat import make_threat_model, observe


def _observation(dataset, index=0, batch=1):
    x, y = dataset.inputs[index:index + batch], dataset.labels[index:index + batch]
    model = build_model(ModelSpec("lenet", dataset.input_shape, dataset.num_classes, seed=0))
    training = TrainingSpec()
    obs = observe(compute_update(model, x, y, training), model, make_threat_model("honest"),
                  input_shape=dataset.input_shape, num_classes=dataset.num_classes, training=training,
                  batch_size=batch, labels=y, defenses=[], modality=dataset.modality)
    return obs, x, y


def _engine(obs, y, **kwargs):
    from gradleak.attacks.replay.matching import UpdateSimulator

    sim = UpdateSimulator(obs)
    shape = (obs.batch_size, *obs.input_shape)
    defaults = dict(matching=Matching(sim, sim.target, "cosine"), labels=FixedLabels(y),
                    candidates=lambda r: Pixels(torch.randn(shape, generator=torch.Generator().manual_seed(r)),
                                                box=True),
                    optimizer=Optimizer("signed-adam", 0.1, schedule="step"), priors=[TotalVariation(1e-6)],
                    iterations=12, restarts=3, box=True, model=sim.model, trace_every=4)
    return Engine(**{**defaults, **kwargs})


def test_restarts_as_a_group_equal_restarts_one_after_another(mnist_test):
    # Adam and the signed step act element by element, so optimising the restarts as one
    # group changes nothing but the order of work
    obs, _, y = _observation(mnist_test)
    apart = _engine(obs, y).run()
    together = _engine(obs, y, joint=True).run()
    assert apart.restart_distances == pytest.approx(together.restart_distances, rel=1e-5)
    assert torch.allclose(apart.inputs, together.inputs, atol=1e-6)
    assert apart.iterations == 36 and together.iterations == 12


def test_successive_halving_stops_the_worse_half(mnist_test):
    obs, _, y = _observation(mnist_test)
    full = _engine(obs, y, restarts=4, joint=True).run()
    halved = _engine(obs, y, restarts=4, joint=True, halving=(0.5,)).run()
    # 4 members for 6 iterations, then 2 for 6, plus one final distance per member
    assert halved.evaluations == 4 * 6 + 2 * 6
    assert full.evaluations == 4 * 12
    assert len(halved.restart_distances) == 2 and len(full.restart_distances) == 4
    # the survivors are those whose distance was lower at the cut: the kept runs are the same
    # runs as in the full group, so each survivor's final distance is one of the full group's
    for d in halved.restart_distances:
        assert min(abs(d - f) for f in full.restart_distances) < 1e-6


def test_trace_records_iteration_and_seconds_and_the_stop_rule(mnist_test):
    obs, _, y = _observation(mnist_test)
    out = _engine(obs, y, restarts=1).run()
    fields = out.trace_fields()
    assert fields["trace_iterations"] == [1, 5, 9, 12]
    assert all(b >= a for a, b in zip(fields["trace_seconds"], fields["trace_seconds"][1:]))
    assert out.converged is None  # no threshold, nothing to judge
    # a threshold the run meets stops it early and says so; one it cannot meet says so too
    met = _engine(obs, y, restarts=1, threshold=0.5).run()
    assert met.converged is True and met.iterations < 12 and met.distance <= 0.5
    unmet = _engine(obs, y, restarts=1, threshold=1e-12).run()
    assert unmet.converged is False and unmet.iterations == 12


def test_reconstruction_carries_the_trace_with_seconds(mnist_test):
    obs, x, y = _observation(mnist_test, index=1)
    rec = make_attack("cpl").reconstruct(obs, AttackContext(seed=0))
    assert rec.converged is True and rec.iterations < 300
    assert len(rec.trace) == len(rec.trace_iterations) == len(rec.trace_seconds) == rec.iterations
    assert rec.trace_iterations == list(range(1, rec.iterations + 1)) and math.isfinite(rec.final_distance)
    scores, _ = score_batch(x, y, rec.inputs, rec.labels, lpips="none", modality="image")
    assert scores[0].psnr > 30  # CPL's patterned start on an MNIST digit converges (test_attacks_optim)


def test_presets_set_defaults_that_explicit_options_override():
    fast = make_attack("ig:preset=fast").options
    paper = make_attack("ig:preset=paper").options
    assert (paper.iterations, paper.restarts, paper.final) == (1500, 4, "mean")
    assert fast.iterations * fast.restarts < paper.iterations * paper.restarts
    assert make_attack("ig:preset=paper,restarts=2").options.restarts == 2
    with pytest.raises(GradleakError, match="attack 'ig' has no preset 'slow'; choose from: fast, paper"):
        make_attack("ig:preset=slow")
    with pytest.raises(GradleakError, match="attack 'dlg' has no presets"):
        make_attack("dlg:preset=fast")


def test_hooks_run_every_n_iterations_across_resumed_segments_and_may_move_the_candidate(mnist_test):
    """A hook is called on the candidate before the step of every `every`-th iteration from
    `start` on, counted over the whole run (a resumed segment goes on counting), without
    gradient tracking, in the order given; what it writes into the variables is what the next
    step starts from (LAMP's rearrangements)."""
    obs, _, y = _observation(mnist_test)
    calls = []

    def flip(candidate, iteration):
        calls.append(("flip", iteration, torch.is_grad_enabled()))
        candidate.x.copy_(candidate.x.flip(-1))  # a move no optimiser step makes

    run = _engine(obs, y, restarts=1, hooks=[Hook(5, flip, start=2),
                                             Hook(5, lambda c, it: calls.append(("after", it, None)), start=2)]).start()
    run.advance(12)
    run.advance(12)
    assert calls[::2] == [("flip", it, False) for it in (2, 7, 12, 17, 22)]
    assert calls[1::2] == [("after", it, None) for it in (2, 7, 12, 17, 22)]

    # flipping the start at iteration 0 is optimising from the flipped start
    shape = (obs.batch_size, *obs.input_shape)
    start = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    hooked = _engine(obs, y, restarts=1, hooks=[Hook(100, flip)]).run()
    flipped = _engine(obs, y, restarts=1, candidates=lambda r: Pixels(start.flip(-1), box=True)).run()
    unhooked = _engine(obs, y, restarts=1).run()
    assert torch.equal(hooked.inputs, flipped.inputs) and not torch.equal(hooked.inputs, unhooked.inputs)


def test_exponential_schedule_decays_to_its_final_rate_and_stays_there_when_resumed():
    """lr × final_lr^(k / (n − 1)) at step k of n, so the last step runs at lr × final_lr; a
    resumed run stays at that rate (LAMP's decay: its budget ladder goes on at the decayed rate)."""
    variable = torch.zeros(1, requires_grad=True)
    optimizer = Optimizer("adam", 0.1, "exponential", final_lr=0.01)
    adam = optimizer.build([variable])
    schedule = optimizer.schedule_for(adam, 5)
    rates = []
    for _ in range(5):
        rates.append(adam.param_groups[0]["lr"])
        adam.step()
        schedule.step()
    assert rates == pytest.approx([0.1 * 0.01 ** (k / 4) for k in range(5)])
    resumed = optimizer.schedule_for(adam, 3, done=5)
    later = []
    for _ in range(3):
        later.append(adam.param_groups[0]["lr"])
        adam.step()
        resumed.step()
    assert later == pytest.approx([0.001] * 3)
