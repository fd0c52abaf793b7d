"""``spectest report`` / ``spectest compare``: break points, K advice, cost, plots, HTML, Markdown.

``table`` (the sweep folder contract and SLOs), ``evidence`` (request counts, intervals and
the "not enough data" judgement), ``sequential`` (decisive steps: repeated confidence
intervals over a step's looks), ``verdicts`` / ``breakpoints`` / ``arm_points`` (crossover,
speedup, SLO break, knee, max goodput — pure functions), ``advisor`` (K per concurrency),
``schedule`` (the crossovers as a speculation schedule in each server's own flags), ``cost``
(cost per 1M output tokens and a capacity plan — pure functions), ``plots`` / ``plots_cost``
(matplotlib PNGs), ``document`` (the page model, Markdown and HTML writers), ``sections`` /
``advice_section`` / ``cost_section`` / ``render`` (report.html / report.md), ``compare`` (two
sweeps) and ``cli``. It reads files only; ``evidence`` and ``sequential`` are plain statistics
that the load generator's live charts use too.
"""
