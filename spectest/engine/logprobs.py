"""Log-probabilities the API reports, computed on the device and read back with the round.

Owns: :func:`candidate_logprobs` — for every row that asked for logprobs, the logprob of each
token a round may emit (each draft, and the token after the accepted ones) and the top-n at
every verified position, as device tensors that travel with the round's one fetch
(``engine.device.fetch``) — and :func:`assemble`, which turns the fetched arrays into
:class:`~spectest.engine.requests.TokenLogprob` records once the host knows how many drafts
each row accepted. Reported logprobs are the target's raw logits' (vLLM's default), before
penalties, temperature and truncation.

Does not know: requests, caches or drafters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from spectest.engine.requests import TokenLogprob


@dataclass(frozen=True)
class Candidates:
    """Device tensors for ``b`` rows at ``P`` positions (a round: P = K + 1)."""

    drafted: torch.Tensor  # [b, P - 1] logprob of each draft at its position
    next: torch.Tensor  # [b] logprob of the token after the accepted drafts
    top_values: torch.Tensor  # [b, P, n] the n most likely tokens' logprobs
    top_ids: torch.Tensor  # [b, P, n]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.drafted, self.next, self.top_values, self.top_ids


def candidate_logprobs(logits: torch.Tensor, drafts: torch.Tensor, n_accepted: torch.Tensor,
                       next_token: torch.Tensor, top_n: int) -> Candidates:
    """logits [b, P, V] (raw), drafts [b, P-1], n_accepted [b], next_token [b]; ``top_n``:
    the most any of the rows asked for."""
    logprobs = F.log_softmax(logits.float(), dim=-1)  # [b, P, V]
    b, P, _ = logprobs.shape
    drafted = logprobs[:, :P - 1].gather(-1, drafts[..., None]).squeeze(-1)  # [b, P-1]
    at_next = logprobs[torch.arange(b, device=logits.device), n_accepted]  # [b, V]
    nxt = at_next.gather(-1, next_token[:, None]).squeeze(-1)  # [b]
    values, ids = logprobs.topk(top_n, dim=-1) if top_n else (logprobs[..., :0],) * 2
    return Candidates(drafted, nxt, values, ids)


def scored(logits: torch.Tensor, tokens: torch.Tensor,
           top_n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [P, V] (raw), tokens [P] → each token's logprob [P] and the top-n logprobs and
    ids [P, n] at each position (a prompt's tokens, a prefill's first token)."""
    logprobs = F.log_softmax(logits.float(), dim=-1)  # [P, V]
    chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # [P]
    values, ids = logprobs.topk(top_n, dim=-1) if top_n else (logprobs[:, :0],) * 2
    return chosen, values, ids


def records(tokens: list[int], chosen: np.ndarray, values: np.ndarray, ids: np.ndarray,
            n: int) -> tuple[TokenLogprob, ...]:
    """:func:`scored`'s fetched arrays → one record per token."""
    return tuple(TokenLogprob(int(t), float(chosen[j]),
                              tuple(zip(ids[j, :n].astype(np.int64).tolist(),
                                        values[j, :n].tolist())) if n else ())
                 for j, t in enumerate(tokens))


def assemble(tokens: list[int], accepted: int, drafted: np.ndarray, nxt: float,
             top_values: np.ndarray, top_ids: np.ndarray, n: int) -> tuple[TokenLogprob, ...]:
    """One row's records for the emitted ``tokens`` (the first ``accepted`` are drafts, the
    next is the target's), from its fetched candidate arrays; ``n``: the row's top-n."""
    out = []
    for j, token in enumerate(tokens):
        value = float(drafted[j]) if j < accepted else float(nxt)
        top = tuple(zip(top_ids[j, :n].astype(np.int64).tolist(),
                        top_values[j, :n].tolist())) if n else ()
        out.append(TokenLogprob(int(token), value, top))
    return tuple(out)
