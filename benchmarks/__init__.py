"""gradleak's benchmarks: `python -m benchmarks [name ...] [--quick]` (benchmarks/__main__.py).

benchmarks/attacks/: how well and how fast an attack recovers a client's data (one attack, or
attacks side by side, per dataset, model, batch, defense or client training).
benchmarks/pipeline/: the auditing around the attacks: judging, verdicts, sweeps and their
seeds, the Flower apps and the guard, the theory study and the package's structure walk.
benchmarks/common.py: the argument conventions every benchmark follows. A benchmark imports
gradleak, benchmarks.common and its group's common module, never another benchmark.
"""
