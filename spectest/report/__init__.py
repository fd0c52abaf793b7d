"""``spectest report`` / ``spectest compare``: break points, K advice, cost, plots, HTML, Markdown.

``table`` (the sweep folder contract and SLOs), ``evidence`` (request counts, bootstrap
intervals and the "not enough data" judgement), ``verdicts`` / ``breakpoints`` / ``arm_points``
(crossover, speedup, SLO break, knee, max goodput — pure functions), ``advisor`` (K per
concurrency), ``cost`` (cost per 1M output tokens and a capacity plan — pure functions),
``plots`` / ``plots_cost`` (matplotlib PNGs), ``document`` (the page model, Markdown and HTML
writers), ``sections`` / ``cost_section`` / ``render`` (report.html / report.md), ``compare``
(two sweeps) and ``cli``. It reads files only.
"""
