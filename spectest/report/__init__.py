"""``spectest report`` / ``spectest compare``: break points, K advice, plots, HTML and Markdown.

``table`` (the sweep folder contract and SLOs), ``breakpoints`` (crossover, SLO break, knee,
max goodput — pure functions), ``advisor`` (K per concurrency), ``plots`` (matplotlib PNGs),
``render`` (report.html / report.md), ``compare`` (two sweeps) and ``cli``. It reads files only.
"""
