"""Reproducers: every finding of an audit saved as the requests that show it, replayable.

Owns: the reproducer file (JSON, one per finding, in ``<out>/reproducers/``) and :class:`Saver`,
which writes one atomically for each kind of finding:

* ``greedy`` — the request both servers answered differently at temperature 0, with where
  they first diverged;
* ``logprobs`` — the request whose candidate logprobs left the baseline's, and the worst
  position;
* ``sampled`` — the seeded sampled requests whose tokens failed the distribution test (the
  candidate's, and the baseline's own where the test compared with them);
* ``text`` — a request whose text the servers end differently (``stop``);
* ``serving`` — the request the candidate failed and the baseline served.

Each file also holds what a condition needs to reproduce it: ``steps``, requests to send the
candidate first (the cold request that fills its prefix cache before the warm one), and
``background``, the traffic it served alongside (the load condition). The bodies are the
requests exactly as sent, both sides' extra fields included; ``spectest replay`` (``replay``)
sends them again and prints the first diverging position with both tokens and their
probabilities — what a user attaches to an upstream bug report.

Does not know: how findings are made (the checks), or HTTP.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from spectest import files

SCHEMA = 1
PATH = "/v1/completions"


class Saver:
    """Writes the reproducers of one audit; ``paths`` lists them in order."""

    def __init__(self, out_dir: str | Path, endpoints: Mapping):
        self.dir = Path(out_dir) / "reproducers"
        self.endpoints = {role: {k: ep.get(k) for k in ("url", "model", "extra")}
                          for role, ep in endpoints.items()}
        self.paths: list[str] = []

    def _write(self, condition: str, check: str, finding: str, **body) -> str:
        name = f"{len(self.paths) + 1:02d}-{_slug(condition)}-{_slug(check)}.json"
        doc = {"spectest_reproducer": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "finding": finding, "condition": condition, "check": check,
               "candidate": self.endpoints.get("candidate"),
               "baseline": self.endpoints.get("baseline"), "steps": [], "background": None}
        doc.update(body)
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(path, json.dumps(doc, indent=1, default=str) + "\n")
        self.paths.append(str(path))
        return str(path)

    def greedy(self, condition: str, divergence, cand, base, steps: Sequence[Mapping] = (),
               background: Mapping | None = None, against_itself: bool = False) -> str:
        """``against_itself``: ``base`` is the candidate's own run (cold, against warm): the
        file's baseline is the candidate."""
        d = divergence
        margin = "?" if d.margin is None else f"{d.margin:.3g}"
        finding = (f"{condition}: greedy output diverges at generated position {d.index + 1} "
                   f"(prompt {d.prompt_id}): candidate token {d.candidate_token}, baseline "
                   f"token {d.baseline_token}, baseline margin {margin} nats")
        extra = {"baseline": self.endpoints.get("candidate")} if against_itself else {}
        return self._write(condition, "greedy", finding, steps=list(steps),
                           background=background, **extra,
                           request={"path": PATH, "candidate": cand.body, "baseline": base.body},
                           observed={"position": d.index, "candidate_token": d.candidate_token,
                                     "baseline_token": d.baseline_token, "margin": d.margin,
                                     "candidate_tokens": list(cand.tokens),
                                     "baseline_tokens": list(base.tokens)})

    def logprobs(self, condition: str, worst, cand, steps: Sequence[Mapping] = (),
                 background: Mapping | None = None) -> str:
        finding = (f"{condition}: the candidate's logprobs leave the baseline's at generated "
                   f"position {worst.index + 1} (prompt {worst.prompt_id}): KL {worst.kl:.3g}, "
                   f"|Δlogprob| {worst.abs_diff:.3g}")
        return self._write(condition, "logprobs", finding, steps=list(steps),
                           background=background,
                           request={"path": PATH, "candidate": cand.body, "baseline": None},
                           observed={"position": worst.index, "kl": worst.kl,
                                     "candidate_tokens": list(cand.tokens)})

    def sampled(self, condition: str, cand_bodies: Sequence[Mapping],
                base_bodies: Sequence[Mapping] | None, p_value: float, summary: str,
                background: Mapping | None = None) -> str:
        finding = f"{condition}: sampled tokens do not follow the baseline's distribution " \
                  f"(p = {p_value:.3g})"
        return self._write(condition, "distribution", finding, background=background,
                           requests={"path": PATH, "candidate": list(cand_bodies),
                                     "baseline": None if base_bodies is None
                                     else list(base_bodies)},
                           observed={"p_value": p_value, "summary": summary})

    def text(self, condition: str, finding: str, cand_body: Mapping,
             base_body: Mapping) -> str:
        """Both servers' text for the same request differs (``stop``)."""
        return self._write(condition, "text", f"{condition}: {finding}",
                           request={"path": PATH, "candidate": cand_body,
                                    "baseline": base_body}, observed={})

    def background(self, condition: str, finding: str, background: Mapping) -> str:
        """The candidate died on the traffic itself: the traffic is the reproducer."""
        return self._write(condition, "serving", finding, background=background,
                           request={"path": PATH, "candidate": None, "baseline": None},
                           observed={"error": finding})

    def serving(self, condition: str, failure, path: str, body: Mapping | None) -> str:
        return self._write(condition, "serving", failure.summary(),
                           request={"path": path, "candidate": body, "baseline": None},
                           observed={"error": failure.error, "breaking": failure.breaking})


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "finding"
