"""Pipeline benchmarks: each bench_<name>.py measures the auditing around the attacks (judging,
verdicts, sweeps, Flower, the guard, theory, structure; `python -m benchmarks NAME`);
benchmarks/pipeline/common.py holds what several share."""
