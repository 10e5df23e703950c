"""turnstile benchmarks (issue #8): ``python -m bench.run [--quick]`` or ``make bench``.

One module per item; each has ``run(quick) -> Section``. `bench.run` runs them
all and writes BENCHMARKS.md. Nothing here asserts on timings: the figures are
reported, and the smoke test (tests/test_bench_smoke.py) only checks that the
harness runs with tiny sizes.
"""
