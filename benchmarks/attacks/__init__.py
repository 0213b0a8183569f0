"""Attack benchmarks: each bench_<name>.py measures how well and how fast attacks recover a
client's data (`python -m benchmarks NAME`); benchmarks/attacks/common.py holds what several share."""
