"""Optimisation attacks: CPL's ASR and iterations, IG's PSNR, and the cost of a
gradient-matching iteration relative to a training step.

`run(quick)` prints ASR / iteration counts / PSNR / cost ratios as JSON. Times
are wall-clock on CPU with one thread; on a shared machine they are inflated.
"""
from __future__ import annotations

import time
from statistics import mean, stdev

import torch

from gradleak.attacks.replay.matching import UpdateSimulator, update_distance
from gradleak.fl import TrainingSpec, compute_update
from gradleak.fl.local import local_update, model_state
from gradleak.models import ModelSpec, build_model
from gradleak.run.experiment import AttackRunSpec, run_attack
from gradleak.threat import make_threat_model, observe


def cpl_summary(dataset: str, model: str, attack: str, images: int, batch_size: int = 1, **spec) -> dict:
    result = run_attack(AttackRunSpec(dataset=dataset, model=model, attack=attack, batch_size=batch_size,
                                      images=images, lpips="none", seed=0, **spec))
    converged = result.extras.get("converged", [])
    return {"asr": round(result.metrics["asr"], 3),
            "attack_converged": round(mean(converged), 3) if converged else None,
            "mean_iterations": round(result.metrics["iterations"], 2),
            "psnr": round(result.metrics["psnr"], 2), "label_acc": round(result.metrics["label_acc"], 3),
            "images": len(result.per_example), "seconds": round(result.seconds, 1)}


MODELS = {  # model -> (dataset input shape, classes)
    "lenet": ((1, 28, 28), 10),
    "convnet": ((3, 32, 32), 10),
    "resnet20": ((3, 32, 32), 10),
    "resnet18": ((3, 32, 32), 10),
    "vgg16": ((3, 32, 32), 10),
    "mlp": ((1, 28, 28), 10),
}
COST_RATIO_TARGET = 2.5  # a matching iteration ≤ 2.5× a training step


def iteration_cost(name: str, batch_size: int, repeats: int, rounds: int = 5) -> dict:
    """Seconds of one IG-style matching iteration (simulate the update with a graph,
    cosine distance, backward to the candidate, Adam step) vs one SGD training step,
    with the cheap double backward of `attacks.replay.double_backward` (`ratio`; for an
    all-linear model the factored gradient of `attacks.replay.factored`), with
    PyTorch's own (`ratio_stock`) and with the frozen-kink finite difference of
    `attacks.replay.finite_difference` (`ratio_difference`: what IG, DLG and CPL run by
    default on convolutional models; an MLP keeps `ratio`); `ratio_default` is
    the one of the path `second_order="auto"` takes. Thread CPU time, so
    the other jobs on a shared machine inflate it less than wall-clock time; the
    minimum over interleaved rounds."""
    shape, classes = MODELS[name]
    model = build_model(ModelSpec(name, shape, classes, seed=0))
    gen = torch.Generator().manual_seed(0)
    x = torch.rand((batch_size, *shape), generator=gen)
    y = torch.randint(classes, (batch_size,), generator=gen)
    training = TrainingSpec(lr=0.1)
    obs = observe(compute_update(model, x, y, training), model, make_threat_model("honest"),
                  input_shape=shape, num_classes=classes, training=training, batch_size=batch_size,
                  labels=y, defenses=[], modality="image")
    candidate = torch.rand_like(x).requires_grad_(True)
    attack_opt = torch.optim.Adam([candidate], lr=0.1)

    def matching_iteration(sim: UpdateSimulator):
        def iteration():
            attack_opt.zero_grad(set_to_none=True)
            update_distance(sim(candidate, y), sim.target, "cosine").backward(inputs=[candidate])
            attack_opt.step()
        return iteration

    params, buffers = model_state(model)

    def training_step():
        _, grads = local_update(model, params, buffers, x, y, training)
        with torch.no_grad():
            for n, g in grads.items():
                params[n].sub_(0.1 * g)

    def timed(fn):
        fn()  # warm-up
        start = time.thread_time()
        for _ in range(repeats):
            fn()
        return (time.thread_time() - start) / repeats

    runs = {"training": training_step,
            "matching": matching_iteration(UpdateSimulator(obs)),
            "matching_stock": matching_iteration(UpdateSimulator(obs, cheap_double_backward=False)),
            "matching_difference": matching_iteration(UpdateSimulator(obs, second_order="difference"))}
    # interleave to share the machine's contention evenly between them
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key, fn in runs.items():
            seconds[key].append(timed(fn))
    best = {k: min(v) for k, v in seconds.items()}
    row = {"matching_ms": round(1e3 * best["matching"], 2),
           "matching_stock_ms": round(1e3 * best["matching_stock"], 2),
           "matching_difference_ms": round(1e3 * best["matching_difference"], 2),
           "training_ms": round(1e3 * best["training"], 2),
           "ratio": round(best["matching"] / best["training"], 2),
           "ratio_stock": round(best["matching_stock"] / best["training"], 2),
           "ratio_difference": round(best["matching_difference"] / best["training"], 2)}
    # the path IG, DLG and CPL take by default (`second_order="auto"`), as the simulator decides it
    differenced = UpdateSimulator(obs, second_order="auto").differenced is not None
    return {"default_path": "difference" if differenced else "exact",
            "ratio_default": row["ratio_difference" if differenced else "ratio"], **row}


def preset_row(preset: str, seeds: tuple[int, ...], images: int, threads: int = 2) -> dict:
    """`ig:preset=...` on cifar10 samples, ConvNet width 64, frozen batch norm, batch 1:
    PSNR and wall seconds per image over every (seed, image) pair, with their spread."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        psnrs, seconds = [], []
        for seed in seeds:
            result = run_attack(AttackRunSpec(dataset="cifar10", model="convnet:width=64", attack=f"ig:preset={preset}",
                                              images=images, lpips="none", seed=seed, bn_mode="eval"))
            psnrs += [p["psnr"] for p in result.per_example]
            seconds += [result.seconds / images] * images
    finally:
        torch.set_num_threads(before)
    return {"pairs": len(psnrs), "psnr_mean": round(mean(psnrs), 2), "psnr_min": round(min(psnrs), 2),
            "psnr_max": round(max(psnrs), 2), "psnr_stdev": round(stdev(psnrs), 2) if len(psnrs) > 1 else None,
            "per_image": [round(p, 2) for p in psnrs], "seconds_per_image": round(mean(seconds), 1),
            "threads": threads, "target_psnr": 25, "target_seconds": 120}


def gradinversion_rows(iterations: int, seeds: tuple[int, ...]) -> dict:
    """GradInversion on an untrained batch-norm ConvNet (width 32, train-mode batch norm),
    cifar10 samples, batch 4, the client's BN statistics granted (`--threat informed`):
    with its BN prior, without it, and IG at the same iterations; PSNR per seed."""
    attacks = {"gradinversion": f"gradinversion:iterations={iterations},restarts=1",
               "gradinversion_bn0": f"gradinversion:iterations={iterations},restarts=1,bn=0",
               "ig": f"ig:iterations={iterations}"}
    rows: dict = {}
    for key, attack in attacks.items():
        psnrs, seconds = [], []
        for seed in seeds:
            result = run_attack(AttackRunSpec(dataset="cifar10", model="convnet", attack=attack, batch_size=4,
                                              images=4, threat="informed", lpips="none", seed=seed))
            psnrs.append(round(result.metrics["psnr"], 2))
            seconds.append(round(result.seconds, 1))
        rows[key] = {"attack": attack, "psnr": psnrs, "seconds": seconds}
    return rows


def run(quick: bool) -> dict:
    torch.set_num_threads(1)
    n_mnist = 6 if quick else 20
    out: dict = {"note": "CPU, 1 thread, shared machine: seconds are inflated (cost ratios use CPU time)"}
    out["cpl_mnist_lenet_b1"] = {
        "random": cpl_summary("mnist", "lenet", "cpl:init=random", n_mnist),
        "patterned_2x2": cpl_summary("mnist", "lenet", "cpl:init=patterned,tile=2", n_mnist),
        "patterned_4x4": cpl_summary("mnist", "lenet", "cpl:init=patterned,tile=4", n_mnist),
    }
    out["cpl_cifar10_lenet_b1"] = cpl_summary("cifar10", "lenet", "cpl", 3 if quick else 20)
    lfw = {}
    for batch in (1, 2, 4, 8, 16):
        images = batch * (1 if quick else max(1, 16 // batch))
        lfw[f"b{batch}"] = cpl_summary("lfw-faces", "lenet", "cpl", images, batch_size=batch)
    asrs = [lfw[f"b{b}"]["asr"] for b in (1, 2, 4, 8, 16)]
    lfw["asr_monotone_non_increasing"] = all(a >= b for a, b in zip(asrs, asrs[1:]))
    out["cpl_lfw_lenet"] = lfw
    # Inverting Gradients in its paper's setting (inversefed's ConvNet width 64, frozen batch
    # norm, batch 1) for each preset, on cifar10 samples (the presets were chosen on
    # imagenet-samples at 32 px): PSNR per image and wall seconds per image, on both cores.
    for preset in ("fast",) if quick else ("fast", "paper"):
        out[f"ig_{preset}_cifar10_convnet64_b1_bn_eval"] = preset_row(preset, (0,) if quick else (0, 1),
                                                                   1 if quick else 4)
    # train-mode batch norm normalises a batch of one by its own statistics (docs/optimization-attacks.md)
    ig = run_attack(AttackRunSpec(dataset="cifar10", model="convnet:width=64", attack="ig:preset=fast",
                                  images=1, lpips="none", seed=0, bn_mode="train"))
    out["ig_fast_cifar10_convnet64_b1_bn_train"] = {"psnr": round(ig.metrics["psnr"], 2),
                                                    "seconds": round(ig.seconds, 1)}
    out["gradinversion_cifar10_convnet_b4_bn_train"] = gradinversion_rows(300 if quick else 1000,
                                                                          (0,) if quick else (0, 1))
    out["matching_vs_training_cost_b8"] = {
        name: iteration_cost(name, 8, 2 if quick or name in ("resnet18", "vgg16") else 5) for name in MODELS}
    out["cost_ratio_target"] = COST_RATIO_TARGET
    out["cost_target_met_by_default_path"] = all(
        row["ratio_default"] <= COST_RATIO_TARGET for row in out["matching_vs_training_cost_b8"].values())
    return out
