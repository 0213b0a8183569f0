"""The resolve boundary of `gradleak.audit` and `run_attack`: the model reference is parsed
once, and the re-identification gallery is drawn from the resolved data with the run's own
targets before the run (docs/architecture.md)."""
import pytest
import torch
from torch import nn

import gradleak
from gradleak.data.references import resolve_data, run_order
from gradleak.errors import GradleakError
from gradleak.models.references import ModelReference, build_named_model, parse_model_reference, resolve_model
from gradleak.run.scenario.gallery import GALLERY_SIZE, examples_gallery, resolved_gallery


def test_a_model_reference_is_parsed_once_into_what_building_takes(mnist_test):
    assert parse_model_reference("convnet:width=8") == ModelReference("convnet:width=8", False, "convnet",
                                                                       {"width": "8"})
    assert parse_model_reference("my_pkg.nets:Net").user
    assert parse_model_reference("models/net.py:build:width=3").user
    with pytest.raises(GradleakError, match="empty model name"):
        parse_model_reference(":width=3")
    # built from the parsed reference, the model is the one its name builds, same seed, same weights
    built, label, _ = resolve_model(parse_model_reference("lenet"), mnist_test, seed=3)
    by_name = build_named_model("lenet", mnist_test.input_shape, mnist_test.num_classes, seed=3,
                                modality=mnist_test.modality)
    assert label == "lenet"
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), by_name.state_dict().values()))


def test_the_gallery_of_your_own_examples_leaves_out_the_run_targets(mnist_test):
    inputs, labels = mnist_test.inputs[:40].clone(), mnist_test.labels[:40].clone()
    resolved = resolve_data((inputs, labels), "test", None)
    targets = run_order(40, 5)[:3]
    gallery = resolved_gallery(resolved.gallery_split, resolved.gallery_draw(targets, GALLERY_SIZE))
    same = examples_gallery(resolved.dataset, targets, resolved.examples_source)
    assert torch.equal(gallery.inputs, same.inputs) and gallery.describe() == same.describe()
    assert len(gallery) == 37 and gallery.note == "all the dataset has besides the attacked examples"
    attacked = {tuple(x.flatten().tolist()) for x in inputs[targets]}
    assert not attacked & {tuple(x.flatten().tolist()) for x in gallery.inputs}
    # the gallery carries the examples' labels (linkage is judged within a class, docs/judging.md)
    kept = [i for i in range(40) if i not in set(targets.tolist())]
    assert torch.equal(gallery.labels, labels[kept])


def test_a_users_gallery_keeps_its_labels_and_inputs_alone_count_for_every_class(mnist_test):
    from gradleak.api.inputs import gallery_inputs
    from gradleak.run.scenario.gallery import with_extra

    x, y = mnist_test.inputs[:5], mnist_test.labels[:5]
    assert torch.equal(gallery_inputs((x, y), mnist_test)[1], y)
    assert torch.equal(gallery_inputs(x, mnist_test)[1], torch.full((5,), -1))
    base = examples_gallery(mnist_test, None, "test examples", size=3)
    both = with_extra(base, gallery_inputs(x, mnist_test))
    assert len(both) == 8 and torch.equal(both.labels, torch.cat([base.labels, torch.full((5,), -1)]))


def test_the_audit_attacks_the_targets_its_gallery_left_out(mnist_test):
    """The run takes its targets in `run_order`, the order the boundary drew the gallery with."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    inputs, labels = mnist_test.inputs[:30].clone(), mnist_test.labels[:30].clone()
    result = gradleak.audit(model, (inputs, labels), attacks=["dlg:iterations=1"], images=2, seed=4)
    run = result.runs[0]
    assert torch.equal(run.originals, inputs[run_order(30, 4)[:2]])
    assert run.metrics["gallery"] == 28


def test_the_sample_ladder_on_data_that_is_not_whole_batches_attacks_whole_batches(mnist_test):
    """Ten examples of your own at batch 4: the ladder's runs take 8 (two clients of 4), never a
    last client of 2 judged as one of 4; `images` that are not whole batches are one line."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    data = (mnist_test.inputs[:10].clone(), mnist_test.labels[:10].clone())
    # an analytic attack under heavy noise: saturated, within the tolerance, open for want of examples
    result = gradleak.audit(model, data, attacks=["fc-analytic"], defenses=["noise:sigma=10"], batch_size=4,
                            seed=[0, 1], sample_rungs=1, max_examples=40, lpips="none")
    assert not result.skipped
    assert [len(run.originals) for run in result.runs] == [4, 4, 8, 8]  # the ladder's runs: all 10 would be 4+4+2
    with pytest.raises(GradleakError, match="use 8 or 12"):
        gradleak.audit(model, data, attacks=["dlg:iterations=1"], batch_size=4, images=10, lpips="none")
    with pytest.raises(GradleakError, match="has 10 examples, the scenario needs 16"):  # not every attack skipped
        gradleak.audit(model, data, attacks=["dlg:iterations=1"], batch_size=16, lpips="none")
