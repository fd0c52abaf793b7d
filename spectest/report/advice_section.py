"""The report's *Configuration* and *Verification* sections: the schedule in each server's own
words, and the proof that it does what the crossovers promised.

*Configuration* words the ``schedule.Schedule`` of every workload and of the traffic mix: the
steps it rests on (batch measured by the server's gauge, the TPOT and throughput ratios with
their n and intervals, the K the schedule runs there), then the flags of every flavour
(``flavours.Knobs``; the measured server's first), then what no schedule can know.

*Verification* reads the ``spec-advised`` arm — the advised configuration run at every step,
by the sweep (``--verify-advice``, the bundled server restarted with it) or against a server the
user started with it (``--advised-host``) — and sets it at each step against the better of
always-on (``spec``) and off (``base``) on each metric, with intervals. A step whose batch moved
across a range boundary of the schedule (the gauge's min and max on both sides of it) is
named: the schedule switched K during it, and whatever that did is in that step's figures.

It words; the numbers come from ``schedule`` and ``evidence``.
"""

from __future__ import annotations

import pandas as pd

from spectest import flavours
from spectest.report import evidence as ev
from spectest.report import schedule as sch
from spectest.report.document import Bullets, Section, Table, fmt
from spectest.report.verdicts import _fmt_c

ADVISED = "spec-advised"
REFERENCES = (("verify-on", "verify-off"), ("spec", "base"))  # measured beside it, else the sweep's
CANNOT_KNOW = (
    "**Batch size is not concurrency.** A server switches K on the requests it runs in one "
    "step; a closed loop of c users gives a batch a little under c (requests between turns, "
    "or waiting) and a batch that moves during the step. The mapping above is measured from "
    "the server's own running-requests gauge where it has one, and stated where it does not.",
    "**Beyond the measured steps nothing is known:** the last range carries its K on to "
    "larger batches (vLLM does the same), unmeasured.",
    "**One workload at a time.** The sweep measured each workload alone; a batch of mixed "
    "workloads speculates with a mixed acceptance. The mix's schedule weights the workloads' "
    "ratios; it is an estimate, not a measurement of mixed traffic.",
    "**A schedule can misbehave at its boundary**: when the batch crosses a range boundary K "
    "changes for every request in it, and upstream users have seen throughput collapse "
    "there. Verify it (`--verify-advice`, or `--advised-host` with a server started with it): "
    "the Verification section names any step whose batch crossed a boundary.",
    "**Acceptance drifts** with traffic and over time; re-run the sweep when either changes.",
)


def measured_flavour(info: dict) -> str:
    server = info.get("server") or {}
    if server.get("embedded"):
        return flavours.SPECTEST.key
    return server.get("flavour") or ""


def _ratio_cell(r: ev.Ratio | None) -> str:
    if r is None or r.value is None:
        return "–"
    return f"{r.text()} — {r.judgement}" if r.judgement not in (ev.THIN, ev.UNRESOLVED) \
        else r.text()


def _batch_cell(mean, low, high) -> str:
    if mean is None:
        return "– (no gauge)"
    spread = f" ({fmt(low, '.0f')}–{fmt(high, '.0f')})" if low is not None else ""
    return f"{mean:.1f}{spread}"


def _ranges_text(s: sch.Schedule) -> str:
    return ", ".join(f"batch {a}–{b}: " + (f"K = {k}" if k else "off") for a, b, k in s.ranges)


def configuration_section(schedules: list[sch.Schedule], info: dict) -> Section:
    cfg = info.get("config") or {}
    objective = cfg.get("objective") or "both"
    first = measured_flavour(info)
    order = sorted(flavours.FLAVOURS, key=lambda f: f.key != first)
    blocks: list = [
        "The crossovers above, turned into the speculation schedule each server takes: "
        "speculation at the K the sweep ran below the crossover, off from it ("
        + {"both": "either crossover, TPOT or throughput, whichever comes first",
           "tpot": "the TPOT crossover", "throughput": "the throughput crossover"}[objective]
        + "; `--objective`). Servers switch on their **batch size**, the requests they run "
          "in one step: each concurrency's batch is shown as measured."]
    if not schedules:
        blocks.append("No schedule: the sweep has no step with both arms.")
    for s in schedules:
        title = (f"**the traffic mix** ({', '.join(f'{w} {v:.0%}' for w, v in s.weights.items())}"
                 f"{'' if cfg.get('mix') else '; equal weights — describe yours with --mix'})"
                 if s.name == sch.MIX else f"**{s.name}**")
        head = (f"{title}: {_ranges_text(s)} — {s.why}." if s.status != sch.NONE
                else f"{title}: {s.why}.")
        blocks.append(head)
        rows = [[_fmt_c(st.concurrency), _batch_cell(st.batch, st.batch_low, st.batch_high),
                 _ratio_cell(st.ratios.get("tpot")), _ratio_cell(st.ratios.get("throughput")),
                 ("off" if st.k == 0 else f"K = {st.k}") if s.status != sch.NONE else "–"]
                for st in s.steps]
        if rows:
            blocks.append(Table(["c", "batch (gauge mean, min–max)", "TPOT speedup",
                                 "throughput ratio", "schedule here"], rows))
        if s.status != sch.NONE:
            words = [f"{f.display}{' (the server measured)' if f.key == first else ''}: "
                     f"`{sch.render(s, f, cfg.get('speculative_config'))}`" for f in order]
            blocks.append(Bullets(words))
        blocks.append(f"Rests on: {s.basis() or 'no crossover'}. Mapping: {s.mapping}.")
    notes = [f"{f.display}: {f.knobs.cannot}" for f in order if f.knobs.cannot]
    notes += [f"{f.display} batch size: {f.knobs.batch}" for f in order if f.knobs.batch]
    notes += [f"{f.display}: checked against the real server — {f.knobs.verified}"
              if f.knobs.verified else f"{f.display}: this form was not run here"
              for f in order]
    blocks += ["What no schedule can know:", Bullets(list(CANNOT_KNOW)),
               "Per server:", Bullets(notes),
               "`schedule.json` holds every schedule (ranges, the steps and ratios behind "
               "them) for scripts."]
    return Section("Configuration: the schedule in each server's words", blocks)


def _better(base, spec, col: str, higher: bool):
    """The better of the always-on and off rows on ``col`` (by the point estimate)."""
    vb, vs = base.get(col), spec.get(col)
    if not (ev.finite(vs) and ev.finite(vb)):
        return None, ""
    pick_spec = (float(vs) > float(vb)) if higher else (float(vs) < float(vb))
    return (spec, "on") if pick_spec else (base, "off")


def boundary_note(s: sch.Schedule | None, low, high) -> str:
    """'the batch crossed the schedule's boundary at 5|6 (K 4 → off) during the step'."""
    if s is None or low is None or high is None:
        return ""
    crossed = [b for b in s.boundaries() if low < b < high]
    if not crossed:
        return ""
    parts = []
    for b in crossed:
        k0, k1 = s.k_at(b - 0.5), s.k_at(b + 0.5)
        parts.append(f"{b - 0.5:.0f}|{b + 0.5:.0f} (K {k0 or 'off'} → {k1 or 'off'})")
    return (f"the batch ({low:.0f}–{high:.0f}) crossed the schedule's boundary at "
            f"{', '.join(parts)} during this step: K switched within it")


def advised_schedule(info: dict) -> sch.Schedule | None:
    """The one schedule the advised server ran for all traffic, where the sweep knows it: the
    bundled server it restarted (``advice_verified``) or ``--advised-schedule``."""
    given = ((info.get("advice_verified") or {}).get("schedule_json")
             or (info.get("config") or {}).get("advised_schedule"))
    return sch.Schedule.from_json(given) if given else None


def verification_rows(table: pd.DataFrame, schedules: list[sch.Schedule],
                      min_requests: int, info: dict | None = None) -> list[dict]:
    """Per workload and step with an advised arm: the comparisons, as data."""
    out = []
    by_name = {s.name: s for s in schedules}
    ran = advised_schedule(info or {})
    for (w, c), g in table.groupby(["workload", "concurrency"]):
        arms = {r["arm"]: r for r in g.to_dict("records")}
        ref = next((pair for pair in REFERENCES if set(pair) <= set(arms)), None)
        if ADVISED not in arms or ref is None:
            continue
        adv = arms[ADVISED]
        on, off = arms[ref[0]], arms[ref[1]]
        row = {"workload": w, "concurrency": float(c), "advised": adv,
               "schedule": ran or by_name.get(w),
               "beside": ref[0] == "verify-on"}
        for metric, col, higher in (("tpot", "tpot_p50_ms", False),
                                    ("throughput", "output_tokens_per_s", True)):
            best, which = _better(off, on, col, higher)
            row[f"{metric}_best"] = which
            row[metric] = (ev.ratio(adv, best, col, higher, float(c), min_requests,
                                    labels=("advised", which)) if best is not None else None)
        out.append(row)
    return out


def _verdict(rs: list[ev.Ratio | None]) -> str:
    js = [r.judgement for r in rs if r is not None]
    if not js:
        return "no data"
    if ev.BEHIND in js:
        return "**worse** than the better arm"
    if all(j in (ev.AHEAD, ev.EVEN) for j in js):
        return ("better than both" if all(j == ev.AHEAD for j in js)
                else "as good as the better arm")
    return "not enough data"


def verification_section(table: pd.DataFrame, schedules: list[sch.Schedule], info: dict,
                         min_requests: int) -> Section | None:
    rows = verification_rows(table, schedules, min_requests, info)
    done = info.get("advice_verified") or {}
    ran = advised_schedule(info)
    if not rows:
        if done.get("same_as"):
            arm = {"spec": "always-on (`spec`)", "base": "off (`base`)"}[done["same_as"]]
            return Section("Verification: the advice, run", [
                f"The advice for {done.get('schedule')} — {done.get('why')} — is the "
                f"{arm} arm's own configuration (`{' '.join(done.get('serve_args') or [])}`), "
                f"so that arm's measurement at every step is its verification; no third arm "
                f"was run."])
        return None
    server = info.get("advised_server") or {}
    beside = any(r["beside"] for r in rows)
    how = (f"a second bundled server started with `spectest serve "
           f"{' '.join(server['serve_args'])}`"
           + (", run beside fresh always-on and off arms of the first server (`verify-on`, "
              "`verify-off`), measured in the same minutes, look by look"
              if beside else "")
           if server.get("serve_args") else
           f"the server at {(info.get('hosts') or {}).get(ADVISED, '--advised-host')}, started "
           f"by the user with the advice and run in every look beside the sweep's two arms"
           if server.get("host") or (info.get("hosts") or {}).get(ADVISED)
           else "the advised configuration")
    cells = []
    for r in rows:
        adv, s = r["advised"], r["schedule"]
        low = adv.get("running_min") if ev.finite(adv.get("running_min")) else None
        high = adv.get("running_max") if ev.finite(adv.get("running_max")) else None
        mean = adv.get("running_mean") if ev.finite(adv.get("running_mean")) else None
        k_here = (s.k_at(mean if mean is not None else r["concurrency"])
                  if s is not None and s.ranges else None)
        note = boundary_note(s, low, high)
        cells.append([r["workload"], _fmt_c(r["concurrency"]), _batch_cell(mean, low, high),
                      "–" if k_here is None else ("off" if k_here == 0 else f"K = {k_here}"),
                      f"vs {r['tpot_best']}: {_ratio_cell(r['tpot'])}" if r["tpot"] else "–",
                      f"vs {r['throughput_best']}: {_ratio_cell(r['throughput'])}"
                      if r["throughput"] else "–",
                      _verdict([r["tpot"], r["throughput"]]), note or "–"])
    worse = [c for c in cells if c[6].startswith("**worse")]
    summary = (f"The advised configuration was worse than the better arm at "
               f"{len(worse)} of {len(cells)} steps: "
               + "; ".join(f"{c[0]} c={c[1]}" + (f" ({c[7]})" if c[7] != "–" else "")
                           for c in worse) + "."
               if worse else
               f"At none of the {len(cells)} steps was the advised configuration worse than the "
               f"better of always-on and off (steps with not enough data say so).")
    return Section("Verification: the advice, run", [
        f"The advised configuration ran as a third arm (`{ADVISED}`): {how}. At every step it "
        f"is set against the better of always-on (`on`) and off (`off`) on each metric — "
        f"TPOT as better TPOT ÷ advised TPOT, throughput as advised ÷ better, so above 1.00× "
        f"the advice is better — with n and intervals (the better arm is picked by its point "
        f"estimate, which favours it: the test is strict). \"schedule here\" is the K the "
        f"schedule gives at the advised arm's mean batch"
        + (f" ({ran.name}'s schedule, which the advised server ran: {_ranges_text(ran)})"
           if ran is not None else
           " (this sweep's own advice for the workload: pass `--advised-schedule` with the "
           "schedule.json the server was started from where that differs)") + ".",
        Table(["workload", "c", "batch (advised arm)", "schedule here", "TPOT speedup",
               "throughput ratio", "verdict", "range boundary"], cells),
        summary])
