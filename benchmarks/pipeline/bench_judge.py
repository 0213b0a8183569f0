"""Re-identification's judge: its speed beside the attack, and the calibration of its bars.

Speed (`python -m benchmarks judge`; `python -m benchmarks judge --only cli [--root ROOT] [--runs RUNS]`
for the CLI command alone, RUNS fresh processes, ROOT a checkout to time another version;
`python -m benchmarks judge --only speed` for the in-process runs alone): MKOR on MNIST,
LeNet-5, batch 100, malicious server, one thread, with its 1,000-example gallery, as
`gradleak attack --dataset mnist --model lenet5 --attack mkor --threat malicious
--batch-size 100 --json` runs it. Reported as the run's JSON reports them: `seconds` (the
run, from the scenario's start: the gallery's reading, the client's update, the attack and
its judging), `attack_seconds` and `judge_seconds` (everything the auditor adds to score the
attack's output: matching, per-image scores, re-identification among the gallery), and
`judge_share` = judge_seconds / seconds, the goal's measure (under 1/4). Beside them:
`reid_seconds` (the re-identification part of judging), `gallery_load_seconds` (reading the
gallery's split, part of `seconds` but not of judging) and, for the CLI, the wall seconds of
the whole command (interpreter and imports included).

In process (`speed`), three runs: `nothing_kept` (the gallery's LPIPS features computed, as
the first run of a study on a machine does; the user cache pointed at an empty folder),
`kept_on_disk` (a new Gallery whose features a former process kept: what a fresh CLI
process does) and `same_gallery` (the Gallery judged before: the later runs of a study in one
process).

Calibration (`python -m benchmarks judge --only calibrate [--quick]`, also part of the
benchmark's run): degraded copies of 100 originals (40 with --quick) judged against
1,000-example galleries of data the project does not report on (never MNIST or CIFAR-10):

* digits: scikit-learn's 8 × 8 digits upsampled to 28 × 28 (MNIST-like strokes);
* gray: LFW faces (skimage.data.lfw_subset) and 28 × 28 tiles of grayscale photos
  (scikit-image's and scikit-learn's sample photos, the foolbox ImageNet samples) downsized
  to a short side of 64, 96 and 128 px;
* colour: 32 × 32 tiles of the same photos in colour (CIFAR-like);
* text: gensim news windows (16 GPT-2 tokens) against the train split's windows;
* tabular: scikit-learn's breast-cancer records (standardised) against the others.

Per degradation: the rate re-identified (rank 0 under any distance, and under each), the
mean linkage AUC per distance, the mean SSIM / LPIPS (ROUGE-1, standardised RMSE) to the
original, and the rate `recognizable` passes. docs/judging.md holds the table.
"""
from __future__ import annotations

import json
import sys
import time

import torch

# the judges re-identification calls, by module (older checkouts lack the candidate-set one)
REID_JUDGES = (("gradleak.metrics.scoring", "judge"), ("gradleak.metrics.scoring", "gallery_ranks"),
               ("gradleak.metrics.candidate_set", "judge_candidates"))


def _timed(module, name: str, spent: list[float]):
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    setattr(module, name, wrapper)
    return original


def _time_reid(spent: list[float]) -> list:
    """Wrap every re-identification judge present with a timer; the (module, name, original)
    to put back."""
    import importlib

    wrapped = []
    for module_name, name in REID_JUDGES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, name):
            wrapped.append((module, name, _timed(module, name, spent)))
    return wrapped


def _run_split(result_json: dict, reid: float) -> dict:
    seconds, judge = result_json["seconds"], result_json.get("judge_seconds")
    return {"seconds": round(seconds, 3), "attack_seconds": result_json.get("attack_seconds"),
            "judge_seconds": judge, "reid_seconds": round(reid, 3),
            "judge_share": round(judge / seconds, 3) if judge is not None else None}


def speed(batch_size: int = 100) -> dict:
    """One MKOR run on MNIST per way the gallery's features are found (module docstring), in
    this process, split as the run's JSON splits it."""
    import os
    import tempfile

    from gradleak.data.references import resolve_data
    from gradleak.metrics.reidentify import Gallery
    from gradleak.run.experiment import AttackRunSpec, run_scenario, scenario_data, scenario_model
    from gradleak.run.scenario.gallery import split_gallery

    torch.set_num_threads(1)
    spec = AttackRunSpec(dataset="mnist", model="lenet5", attack="mkor", threat="malicious", batch_size=batch_size)
    data = scenario_data(spec)
    model = scenario_model(spec, data)
    other_split = resolve_data(spec.dataset, spec.split, spec.resize).gallery_split  # as a run draws it
    start = time.perf_counter()
    loaded = split_gallery(other_split)
    load = time.perf_counter() - start
    spent: list[float] = []
    wrapped = _time_reid(spent)
    out = {}
    try:
        with tempfile.TemporaryDirectory() as empty:
            kept = os.environ.get("GRADLEAK_CACHE")
            for name in ("nothing_kept", "kept_on_disk", "same_gallery"):
                if name == "nothing_kept":
                    os.environ["GRADLEAK_CACHE"] = empty
                elif kept is None:
                    os.environ.pop("GRADLEAK_CACHE", None)
                else:
                    os.environ["GRADLEAK_CACHE"] = kept
                gallery = loaded if name == "same_gallery" else Gallery(loaded.inputs.clone(), loaded.source)
                if name == "kept_on_disk":  # the features a former process kept (written here if none were)
                    run_scenario(spec, model, data, gallery=Gallery(loaded.inputs, loaded.source))
                    gallery = Gallery(loaded.inputs.clone(), loaded.source)
                if name == "same_gallery":
                    run_scenario(spec, model, data, gallery=gallery)
                spent.clear()
                result = run_scenario(spec, model, data, gallery=gallery)
                out[name] = _run_split(result.to_json(), sum(spent))
    finally:
        for module, name, original in wrapped:
            setattr(module, name, original)
    metrics = result.metrics
    return {**out, "gallery_load_seconds": round(load, 3), "gallery": len(loaded), "batch_size": batch_size,
            "reid": metrics.get("reid"), "linkage": metrics.get("linkage"),
            "recognizable": metrics.get("recognizable"), "ssim": metrics.get("ssim"), "lpips": metrics.get("lpips"),
            "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------- calibration


def _photos() -> list[torch.Tensor]:
    """(3, H, W) photos in [0, 1]: scikit-image's and scikit-learn's samples, foolbox's ImageNet samples."""
    import numpy as np
    import skimage.data as sk
    from sklearn.datasets import load_sample_images

    from gradleak.data import DatasetSpec, load_dataset

    arrays = [getattr(sk, name)() for name in ("astronaut", "camera", "chelsea", "coffee", "rocket", "coins",
                                               "moon", "page", "text", "brick", "grass", "gravel", "retina",
                                               "immunohistochemistry", "hubble_deep_field", "cell")]
    arrays += list(load_sample_images().images)
    photos = []
    for a in arrays:
        a = np.asarray(a, dtype=np.float32) / (255.0 if np.asarray(a).max() > 1 else 1.0)
        x = torch.from_numpy(a)
        photos.append(x[None].expand(3, -1, -1) if x.dim() == 2 else x[..., :3].permute(2, 0, 1))
    photos += list(load_dataset(DatasetSpec("imagenet-samples", split="test")).inputs)
    return photos


def _tiles(photos: list[torch.Tensor], side: int, gray: bool) -> torch.Tensor:
    from gradleak.data.transforms import resize_images

    tiles = []
    for photo in photos:
        for short in (64, 96, 128):
            h, w = photo.shape[-2:]
            x = resize_images(photo[None], (max(short, round(h * short / min(h, w))),
                                            max(short, round(w * short / min(h, w)))))[0]
            x = x.mean(0, keepdim=True) if gray else x
            for top in range(0, x.shape[1] - side + 1, side):
                for left in range(0, x.shape[2] - side + 1, side):
                    tiles.append(x[:, top:top + side, left:left + side])
    return torch.stack(tiles)


def image_pools() -> dict[str, torch.Tensor]:
    import numpy as np
    from sklearn.datasets import load_digits

    from gradleak.data.lfw import lfw_faces
    from gradleak.data.transforms import resize_images

    digits = torch.from_numpy(load_digits().images.astype(np.float32) / 16)[:, None]
    faces = resize_images(torch.from_numpy(lfw_faces())[:, None], 28)
    photos = _photos()
    return {"digits": resize_images(digits, 28),
            "gray": torch.cat([faces, _tiles(photos, 28, gray=True)]),
            "colour": _tiles(photos, 32, gray=False)}


def _split(pool: torch.Tensor, n: int, size: int = 1000, seed: int = 0):
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))
    return pool[order[:n]], pool[order[n:n + size]], pool[order[n + size:]]


def _blur(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    k = kernel / kernel.sum()
    pad = len(k) // 2
    c = x.shape[1]
    x = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    x = F.conv2d(x, k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    return F.conv2d(x, k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


def _gauss(sigma: float) -> torch.Tensor:
    r = max(1, int(3 * sigma + 0.5))
    t = torch.arange(-r, r + 1, dtype=torch.float32)
    return torch.exp(-t ** 2 / (2 * sigma ** 2))


def _shift(x: torch.Tensor, px: int) -> torch.Tensor:
    import torch.nn.functional as F

    return F.pad(x, (px, 0, px, 0), mode="replicate")[..., :x.shape[-2], :x.shape[-1]]


def image_degradations(x: torch.Tensor, spare: torch.Tensor, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(x.shape, generator=g)
    uniform = torch.rand(x.shape, generator=g)
    out = {"copy": x.clone()}
    for sigma in (0.5, 1.0, 1.5, 2.0, 3.0):
        out[f"gaussian blur sigma {sigma:g} px"] = _blur(x, _gauss(sigma))
    for width in (3, 5, 7):
        out[f"box blur {width}x{width}"] = _blur(x, torch.ones(width))
    for sigma in (0.05, 0.1, 0.2, 0.3, 0.5):
        out[f"noise sigma {sigma:g}"] = (x + sigma * noise).clamp(0, 1)
    for px in (1, 2, 4):
        out[f"shift {px} px"] = _shift(x, px)
    out["faint copy in speckle (0.2 x + 0.8 u)"] = 0.2 * x + 0.8 * uniform
    out["binarised noisy copy (x + N(0, 0.5) > 0.5)"] = ((x + 0.5 * noise) > 0.5).float()
    # partial reconstructions as gradient attacks leave them: a faint, smooth trace of the
    # original under smooth clutter, or a ghost of it over another example
    smooth = _blur(uniform, _gauss(2.0))
    out["faint blurred copy in smooth clutter (0.3 blur x + 0.7 blur u)"] = 0.3 * _blur(x, _gauss(2.0)) + 0.7 * smooth
    out["ghost over another example (0.3 x + 0.7 other)"] = \
        0.3 * x + 0.7 * spare[torch.randint(len(spare), (len(x),), generator=torch.Generator().manual_seed(seed + 1))]
    out["uniform speckle"] = uniform
    out["smooth clutter (blur u)"] = smooth
    out["sign-like binary noise"] = (noise > 0).float()
    out["grey + noise 0.25"] = (0.5 + 0.25 * noise).clamp(0, 1)
    out["another example"] = spare[torch.randint(len(spare), (len(x),), generator=g)]
    return out


def _row(verdict, bar) -> dict:
    n = len(verdict.rank)
    per = {d: sum(r[d] == 0 for r in verdict.ranks) / n for d in verdict.ranks[0]}
    aucs = {d: sum(a[d] for a in verdict.aucs) / n for d in verdict.aucs[0]}
    passed = list(bar)
    return {"rank0": sum(r == 0 for r in verdict.rank) / n, "rank0_by": per, "linkage": sum(verdict.linkage) / n,
            "auc_by": aucs, "auc_sd": float(torch.tensor(verdict.linkage).std()),
            "passes_bar": sum(passed) / n,
            "recognizable": sum(p and r == 0 for p, r in zip(passed, verdict.rank)) / n}


def calibrate_images(n: int) -> dict:
    from gradleak.metrics.image import ssim
    from gradleak.metrics.lpips import lpips_distance
    from gradleak.metrics.reidentify import Gallery, judge
    from gradleak.metrics.scoring import RECOGNIZABLE_LPIPS, RECOGNIZABLE_SSIM

    out = {}
    for name, pool in image_pools().items():
        originals, gallery_inputs, spare = _split(pool, n)
        gallery = Gallery(gallery_inputs, name)
        rows = {}
        for degradation, recon in image_degradations(originals, spare).items():
            recon = recon.clamp(0, 1)
            s, lp = ssim(originals, recon), lpips_distance(originals, recon).detach()
            verdict = judge(originals, recon, gallery, ("ssim", "lpips"), ("ssim", "lpips", "pearson"))
            bar = [(a >= RECOGNIZABLE_SSIM or b <= RECOGNIZABLE_LPIPS) for a, b in zip(s.tolist(), lp.tolist())]
            rows[degradation] = {**_row(verdict, bar), "ssim": float(s.mean()), "ssim_p10": float(s.quantile(0.1)),
                                 "lpips": float(lp.mean()), "lpips_p90": float(lp.quantile(0.9))}
        out[name] = {"originals": len(originals), "gallery": len(gallery), "rows": rows}
    return out


def calibrate_text(n: int) -> dict:
    from gradleak.data import DatasetSpec, load_dataset
    from gradleak.data.text import PAD_TOKEN
    from gradleak.metrics.reidentify import Gallery, judge
    from gradleak.metrics.text import RECOGNIZABLE_ROUGE1, score_text

    test = load_dataset(DatasetSpec("news", split="test"))
    train = load_dataset(DatasetSpec("news", split="train"))
    g = torch.Generator().manual_seed(0)
    x = test.inputs[torch.randperm(len(test), generator=g)[:n]]
    gallery = Gallery(train.inputs[torch.randperm(len(train), generator=g)[:1000]], "news train")
    vocab = int(max(test.inputs.max(), train.inputs.max())) + 1
    cases = {"copy": x.clone(), "shuffled words": torch.stack([r[torch.randperm(len(r), generator=g)] for r in x])}
    for p in (0.25, 0.5, 0.75):
        swap = torch.rand(x.shape, generator=g) < p
        random = torch.randint(0, vocab, x.shape, generator=g)
        cases[f"{int(p * 100)}% tokens substituted"] = torch.where(swap, random, x)
    cases["random tokens"] = torch.randint(0, vocab, x.shape, generator=g)
    cases["another window"] = train.inputs[torch.randint(len(train), (n,), generator=g)]
    rows = {}
    for name, recon in cases.items():
        verdict = judge(x, recon, gallery, ("tokens",), pad_token=PAD_TOKEN)
        rouge1 = [score_text(x[i:i + 1], recon[i:i + 1]).rouge1 for i in range(n)]
        rows[name] = {**_row(verdict, [r >= RECOGNIZABLE_ROUGE1 for r in rouge1]), "rouge1": sum(rouge1) / n}
    return {"originals": n, "gallery": len(gallery), "rows": rows}


def calibrate_tabular(n: int) -> dict:
    from gradleak.data import DatasetSpec, load_dataset
    from gradleak.metrics.reidentify import Gallery, gallery_scale, judge
    from gradleak.metrics.scoring import RECOGNIZABLE_TABULAR_Z

    data = torch.cat([load_dataset(DatasetSpec("breast-cancer", split=s)).inputs for s in ("train", "test")])
    x, gallery_inputs, _ = _split(data, n)
    gallery = Gallery(gallery_inputs, "breast-cancer")
    scale = gallery_scale(gallery)
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(x.shape, generator=g)
    cases = {f"noise sigma {s:g} (standardised)": x + s * noise for s in (0.1, 0.25, 0.5, 1.0, 2.0)}
    cases["gaussian record"] = torch.randn(x.shape, generator=g)
    cases["another record"] = gallery_inputs[torch.randint(len(gallery_inputs), (n,), generator=g)]
    rows = {}
    for name, recon in cases.items():
        verdict = judge(x, recon, gallery, ("l2",))
        rmse_z = ((recon - x) / scale).pow(2).mean(1).sqrt()
        rows[name] = {**_row(verdict, (rmse_z <= RECOGNIZABLE_TABULAR_Z).tolist()), "rmse_z": float(rmse_z.mean())}
    return {"originals": n, "gallery": len(gallery), "rows": rows}


def calibrate(quick: bool = False) -> dict:
    torch.set_num_threads(1)
    n = 40 if quick else 100
    return {"images": calibrate_images(n), "text": calibrate_text(n), "tabular": calibrate_tabular(n)}


CLI_ARGS = ["attack", "--dataset", "mnist", "--model", "lenet5", "--attack", "mkor", "--threat", "malicious",
            "--batch-size", "100", "--json"]


def cli(root: str | None = None, runs: int = 3) -> dict:
    """The CLI command in `runs` fresh processes on one thread: per run its wall seconds
    (interpreter and imports included) and the run's JSON split (module docstring), then the
    range of each over the runs. `root`: the checkout whose gradleak runs (default: this one)."""
    import os
    import subprocess
    from pathlib import Path

    root = root or str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    each = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, *CLI_ARGS], capture_output=True, text=True,
                              env=env, cwd=root, timeout=1800)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        inside = json.loads(proc.stderr.strip().splitlines()[-1])
        judge = inside["judge_seconds"]
        each.append({"wall_seconds": round(wall, 3), **inside,
                     "judge_share_of_wall": round(judge / wall, 3) if judge is not None else None})
    keys = [k for k, v in each[0].items() if isinstance(v, float) and k not in ("reid", "linkage", "recognizable")]
    ranges = {k: [min(r[k] for r in each), max(r[k] for r in each)] for k in keys
              if all(isinstance(r.get(k), float) for r in each)}
    return {"root": root, "runs": each, "ranges": ranges}


def _cli_child(argv: list[str]) -> None:
    import contextlib
    import io

    import gradleak.run.experiment as experiment
    from gradleak.cli import main

    torch.set_num_threads(1)
    reid: list[float] = []
    loaded: list[float] = []
    _time_reid(reid)
    _timed(experiment, "resolved_gallery", loaded)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    result = json.loads(out.getvalue()) if rc == 0 else {}
    metrics = result.get("metrics", {})
    print(json.dumps({**_run_split(result, sum(reid)), "gallery_load_seconds": round(sum(loaded), 3),
                      "reid": metrics.get("reid"), "linkage": metrics.get("linkage"),
                      "recognizable": metrics.get("recognizable")}), file=sys.stderr)


def run(quick: bool) -> dict:
    return {"cli": cli(), "in_process": speed(), "calibration": calibrate(quick)}


def run_with(argv: list[str]) -> dict:
    # imported here, not at the top: `cli` runs this file as a script under another checkout's
    # PYTHONPATH, whose benchmarks package may predate benchmarks.common
    from benchmarks import common

    parser = common.parser("judge")
    parser.add_argument("--only", choices=("cli", "speed", "calibrate"), default=None,
                        help="one part of the benchmark (default: all three)")
    parser.add_argument("--root", default=None, help="cli: the checkout whose gradleak runs (default: this one)")
    parser.add_argument("--runs", type=int, default=3, help="cli: fresh processes")
    args = parser.parse_args(argv)
    if args.only == "cli":
        return cli(args.root, args.runs)
    if args.only == "speed":
        return speed()
    if args.only == "calibrate":
        return calibrate(args.quick)
    return {"cli": cli(args.root, args.runs), "in_process": speed(), "calibration": calibrate(args.quick)}


if __name__ == "__main__":  # the child process `cli` times: `python bench_judge.py ARGS` runs `gradleak ARGS`
    _cli_child(sys.argv[1:])
