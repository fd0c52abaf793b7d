"""``spectest sweep``: rising-concurrency load sweeps, speculation on vs off, per workload.

``config`` (flags → SweepConfig), ``embedded`` (the bundled server as a child), ``step`` (one
headless Locust run, watched live), ``summary`` (a step's Locust folder → one row),
``engine_metrics`` (round timings from /metrics), ``run`` (the loop, files, early stop),
``progress`` (the terminal) and ``cli``. The analysis lives in ``spectest.report``.
"""
