"""The sections of ``report.md`` / ``report.html``, built from one ``Analysis`` of a sweep.

``analyse`` computes everything once — break points, K advice and the cost plan, all under the
sweep's minimum of requests per step — and the section builders word it: the verdict per
workload, the setup (with how intervals are made), the speedup at concurrency 1, the break
points, the K advisor and every step. Every stated speedup, crossover and break point carries
the requests behind it and its interval, or says "not enough data" (``evidence``).

Options live in ``sweep.json``'s ``config`` (``min_requests_per_step``, prices, target load);
``with_options`` lays command-line overrides over them. Numbers come from ``breakpoints``,
``arm_points``, ``advisor`` and ``cost``; this module only words them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from spectest.loadgen import cpu
from spectest.report import advisor, schedule, sequential
from spectest.report import breakpoints as bpm
from spectest.report import cost as costm
from spectest.report import evidence as ev
from spectest.report.cost_section import saving_text
from spectest.report.document import Bullets, Image, Section, Table, _x, fmt
from spectest.report.plots import ARM_LABELS
from spectest.report.table import SLO, STEPS_CSV, Sweep


@dataclass(frozen=True)
class Analysis:
    sweep: Sweep
    found: tuple[bpm.BreakPoint, ...]
    min_requests: int
    inputs: costm.CostInputs
    costs: tuple[costm.WorkloadCost, ...]
    advice: tuple[advisor.Advice, ...]
    schedules: tuple[schedule.Schedule, ...] = ()


def with_options(sweep: Sweep, slo: SLO | None = None, min_requests: int | None = None,
                 cost: costm.CostInputs | None = None,
                 network_ms: float | None = None, advice: dict | None = None) -> Sweep:
    """The sweep with command-line overrides laid over its ``sweep.json`` options. Prices
    replace prices as a pair, and a target load replaces the other kind of target;
    ``advice``: the schedule's options (objective, mix, speculative_config)."""
    info = dict(sweep.info)
    cfg = {**(info.get("config") or {}), **(advice or {})}
    if slo is not None:
        info["slo"] = slo.to_json()
    if min_requests is not None:
        cfg["min_requests_per_step"] = min_requests
    if network_ms is not None:
        cfg["network_ms"] = network_ms
    if cost is not None:
        new = cost.to_json()
        for pair in (("price_per_hour", "spec_price_per_hour"),
                     ("target_rps", "target_output_tps")):
            if any(new[k] is not None for k in pair):
                cfg.update({k: new[k] for k in pair})
    return replace(sweep, info={**info, "config": cfg})


def min_requests_of(sweep: Sweep) -> int:
    v = (sweep.info.get("config") or {}).get("min_requests_per_step")
    return int(v) if v is not None else ev.MIN_REQUESTS_PER_STEP


def analyse(sweep: Sweep) -> Analysis:
    t, m = sweep.table, min_requests_of(sweep)
    inputs = costm.CostInputs.from_json(sweep.info.get("config"))
    found = bpm.find_all(t, sweep.slo, sweep.workloads, min_requests=m)
    costs = costm.analyse(t, sweep.slo, inputs, sweep.workloads, m)
    network = (sweep.info.get("config") or {}).get("network_ms")  # a what-if (report flag)
    advice = [a for w in sweep.workloads
              for a in advisor.advise(t, w, min_requests=m, network_ms=network)]
    cfg = sweep.info.get("config") or {}
    try:
        mix = schedule.parse_mix(cfg.get("mix") or "", sweep.workloads)
    except schedule.MixError:
        mix = {}
    schedules = schedule.build_all(t, sweep.workloads, cfg.get("objective") or "both", m, mix)
    return Analysis(sweep, tuple(found), m, inputs, tuple(costs), tuple(advice),
                    tuple(schedules))


# --- verdict --------------------------------------------------------------------------------
def _pace(r: ev.Ratio) -> str:
    j = r.judgement
    if j == ev.AHEAD:
        return "faster"
    if j == ev.BEHIND:
        return "as fast (slower)"
    return ("as fast (no difference that matters)" if r.has_interval
            else "as fast (within the measured noise)")


def speed_sentence(s: bpm.Speedup) -> str:
    """'speculation is **2.99×** faster per output token (n = …; 95% interval …; throughput
    2.37× (…))', or what is missing."""
    if s.enough:
        return (f"speculation is **{_x(s.tpot)}** {_pace(s.tpot_ratio)} per output token "
                f"({s.tpot_ratio.evidence()}; throughput"
                f"{_colon(s.throughput_ratio.text() if s.throughput_ratio else 'no data')}; "
                f"acceptance {fmt(s.acceptance_rate, '.2f')}, mean accepted length "
                f"{fmt(s.mean_accepted_length, '.2f')})")
    parts = [f"{name}: {r.text() if r is not None else 'no data'}"
             for name, r in (("TPOT speedup", s.tpot_ratio),
                             ("throughput ratio", s.throughput_ratio))]
    return "; ".join(parts)


def _colon(text: str) -> str:
    """' 1.37× (…)' but ': not enough data (…)'."""
    return f" {text}" if text[:1].isdigit() else f": {text}"


def verdict(an: Analysis, w: str) -> str:
    t = an.sweep.table
    s = bpm.speedup_at(t, w, min_requests=an.min_requests)
    if s.concurrency is None:
        return f"**{w}**: no concurrency was measured with both arms."
    where = "concurrency 1" if s.concurrency == 1 else f"concurrency {s.concurrency:g} " \
                                                       f"(the lowest step both arms ran)"
    text = f"**{w}**: at {where} {speed_sentence(s)}. "
    if not s.enough:
        alt = bpm.first_supported(t, w, an.min_requests)
        text += (f"At c={alt.concurrency:g}, the lowest step with enough data, "
                 f"{speed_sentence(alt)}. " if alt is not None and alt.concurrency !=
                 s.concurrency else "No step has enough data for a speedup. ")
    by = {(b.kind, b.arm): b for b in an.found if b.workload == w}
    crossings = "; ".join(crossing(by[(k, None)], m) for k, m in (
        ("crossover_tpot", "TPOT"), ("crossover_throughput", "throughput")) if (k, None) in by)
    text += crossings[:1].upper() + crossings[1:] + "."
    wc = next((x for x in an.costs if x.workload == w), None)
    if wc is not None and {"spec", "base"} <= set(wc.plans):
        text += f" Cost: {saving_text(wc.saving, wc)}."
    return text


def crossing(bp: bpm.BreakPoint, metric: str) -> str:
    dips = [n.split("at c=", 1)[1].split(" ", 1)[0] for n in bp.notes
            if n.startswith("speculation dipped")]
    but = (f" (though no better at c={', '.join(dips)}, then ahead again: noise?)"
           if dips else "")
    if bp.status == bpm.FOUND:
        return (f"on {metric} it stops paying at **c ≈ {bp.concurrency:.1f}** (between "
                f"{bp.lower:g} and {bp.upper:g}; {bp.basis}){but}")
    if bp.status == bpm.BELOW:
        return f"on {metric} it is no better even at the lowest step ({bp.basis})"
    if bp.status == bpm.NOT_REACHED:
        return f"on {metric} it still pays at the highest step measured ({bp.basis}){but}"
    if bp.status == bpm.NOT_ENOUGH:
        return f"on {metric}, not enough data to place a crossover ({bp.basis})"
    return f"no {metric} crossover (no data)"


# --- setup, speedup, break points -----------------------------------------------------------
def setup_section(an: Analysis) -> Section:
    sweep = an.sweep
    info, t = sweep.info, sweep.table
    cfg = info.get("config", {})
    peer = info.get("peer") or {}  # runs of another tool (``peers``): their own setup line
    setup = [
        f"Status: **{info.get('status', 'unknown')}** — {len(t)} steps measured"
        + (f" in {fmt(info.get('elapsed_s'), '.0f')} s" if info.get("elapsed_s") else "") + ".",
        f"Server: {_server(info)}.",
        f"Workloads {', '.join(sweep.workloads)}; " + (peer["setup"] if peer else
        f"concurrency "
        f"{', '.join(str(c) for c in cfg.get('steps', sorted(set(t.concurrency))))}; "
        f"{fmt(cfg.get('warmup_s'), 'g')} s warm-up then {fmt(cfg.get('step_time_s'), 'g')} s "
        f"measured per {'look' if cfg.get('looks') else 'step'} and arm "
        f"({cfg.get('windows', '?')} windows"
        + (f"; up to {cfg['looks']} looks per step" if (cfg.get('looks') or 1) > 1 else "")
        + f"); max tokens "
        f"{cfg.get('max_tokens', '?')}; temperature {cfg.get('temperature', '?')}; "
        f"seed {cfg.get('seed', '?')}."),
        f"SLOs: {sweep.slo.describe()}.",
        f"Step resolution: {bpm.resolution(t)}.",
        ev.method_text(an.min_requests)]
    if not peer:
        setup.append(decisive_text(t, cfg))
    note = ev.interval_note(t, peer.get("no_intervals"))
    if note:
        setup.append(note)
    machine = info.get("machine") or {}
    if machine:
        setup.append(busy_machine(machine, t))
    client = load_generator(t)
    if client:
        setup.append(client)
    notes = list(info.get("notes") or [])
    return Section("Setup", [Bullets(setup)] + ([Bullets(notes)] if notes else []))


def decisive_text(t: pd.DataFrame, cfg: dict) -> str:
    """How the steps were made decisive, and which settled and which reached the cap."""
    looks = int(cfg.get("looks") or 1)
    text = sequential.method_text(looks, cfg.get("step_time_s"))
    if "decided" not in t or t.decided.dropna().empty:
        return text
    pairs = t[t.arm == "spec"].sort_values(["workload", "concurrency"])

    def steps(status: str) -> str:
        rows = pairs[pairs.decided == status]
        return ", ".join(f"{r.workload} c={r.concurrency:g}"
                         + (f" ({int(r.looks)} looks)" if r.looks > 1 else "")
                         for r in rows.itertuples()) or "none"
    return (f"{text} Settled: {steps(sequential.SETTLED)}. Reached the cap without settling: "
            f"{steps(sequential.CAP)}.")


def speedup_section(an: Analysis) -> Section:
    t, rows = an.sweep.table, []
    for w in an.sweep.workloads:
        shown = [bpm.speedup_at(t, w, min_requests=an.min_requests)]
        alt = bpm.first_supported(t, w, an.min_requests)
        if not shown[0].enough and alt is not None and alt.concurrency != shown[0].concurrency:
            shown.append(alt)
        for i, s in enumerate(shown):
            rows.append([w, fmt(s.concurrency, "g") + (" (lowest with enough data)" if i else ""),
                         s.tpot_ratio.text() if s.tpot_ratio else "–",
                         s.throughput_ratio.text() if s.throughput_ratio else "–", _x(s.e2el),
                         fmt(s.acceptance_rate, ".2f"), fmt(s.mean_accepted_length, ".2f")])
    return Section("Speedup at concurrency 1", [Table(
        ["workload", "c", "TPOT speedup", "throughput ratio", "E2EL speedup", "acceptance",
         "mean accepted length"], rows),
        "TPOT speedup = baseline TPOT p50 / speculative TPOT p50; throughput ratio = speculative "
        "output tokens/s / baseline; E2EL speedup likewise on end-to-end latency p50 (no "
        "interval). n = successful requests per arm in the step."])


def breakpoints_section(an: Analysis) -> Section:
    by = {(b.workload, b.kind, b.arm): b for b in an.found}
    ws = an.sweep.workloads
    cross = [[w, by[(w, "crossover_tpot", None)].summary(),
              by[(w, "crossover_throughput", None)].summary()] for w in ws]
    per_arm = []
    for w in ws:
        for arm in ("spec", "base"):
            if (w, "slo", arm) not in by:
                continue
            g = by[(w, "max_goodput", arm)]
            per_arm.append([w, ARM_LABELS[arm], by[(w, "slo", arm)].summary(),
                            by[(w, "knee", arm)].summary(),
                            f"{fmt(g.metric, '.3g')} req/s at c={fmt(g.concurrency, 'g')} — "
                            f"{g.basis}" if g.status == bpm.FOUND else g.headline()])
    evidence = [f"{b.workload} · {b.kind.replace('_', ' ')}"
                + (f" · {ARM_LABELS.get(b.arm, b.arm)}" if b.arm else "")
                + f": {b.evidence}" + (f" [{b.basis}]" if b.basis and b.arm else "")
                + "".join(f" (note: {n})" for n in b.notes)
                for b in an.found]
    return Section("Break points", [
        "**Speculation crossover** — the lowest concurrency at which speculation is no better "
        "than the baseline (TPOT p50; throughput separately), with the ratio, requests and "
        "interval at the steps it rests on:",
        Table(["workload", "crossover (TPOT)", "crossover (throughput)"], cross),
        "**Per arm** — SLO break point (the highest concurrency meeting every SLO), saturation "
        "knee (throughput stops growing while latency rises) and the best goodput measured, "
        "each with the successful requests (n) of the steps it rests on:",
        Table(["workload", "arm", "SLO break point", "saturation knee", "max goodput"],
              per_arm),
        "Evidence, from the measured steps:", Bullets(evidence)])


# --- K advisor, steps -----------------------------------------------------------------------
def k_section(an: Analysis, figure: Path | None) -> Section:
    advice = an.advice
    if not advice:
        return Section("K advisor", ["No advice: the sweep has no per-position acceptance or "
                                     "no K (the speculative arm did not report them)."])
    rows = [[a.workload, fmt(a.concurrency, "g"), str(a.k_run), fmt(a.c_eff, ".3f"),
             a.measured.text() if a.measured else _x(a.measured_at_run),
             _x(a.predicted_at_run),
             ("off" if a.best_k == 0 else str(a.best_k)) if a.supported
             else "not enough data", _x(a.predicted_best) if a.supported else "–",
             (f"{a.validated_evidence.text()}, mean K {fmt(a.validated_k, '.1f')}"
              if a.validated_evidence is not None else "–"),
             "; ".join(x for x in ("" if a.plausible else "costs implausible (noise)",
                                   f"{a.rounds:,.0f} engine rounds" if a.rounds else "") if x)]
            for a in advice]
    networked = [a for a in advice if a.network_ms is not None]
    if networked:  # a disaggregated drafter (measured) or a what-if: one more column
        for row, a in zip(rows, advice):
            row.insert(4, "–" if a.network_ms is None else
                       f"{a.network_ms:.2f} ({a.network_source})")
    src = sorted({a.source for a in advice})
    blocks = [
        "From the measured per-position acceptance p_i and the measured cost of a speculative "
        "round relative to a plain target step, the seeds' formula predicts the speedup at "
        "each K: speedup(K) = (1 + Σ_{i<K} p_i) / (1 + c·K), with c (overhead per draft "
        "token) measured at each concurrency — it grows with load because verifying B·K extra "
        "tokens stops being free. Positions past the K that ran are continued geometrically; "
        f"costs come from {' and '.join(src)} and are assumed linear in K. The measured "
        f"speedup carries its requests and interval; costs from client TPOT with fewer than "
        f"{an.min_requests} successful requests per arm give no best K. The best K is a "
        f"prediction: the schedule (Configuration) runs the K that was measured.",
        Table(["workload", "c", "K run", "c (cost/draft token)"]
              + (["network ms/round"] if networked else [])
              + ["measured speedup", "predicted at K run", "best K", "predicted at best K",
                 "advised arm (measured)", "note"], rows)]
    if networked:
        blocks.append(
            "**Network term.** The draft runs in another process (`spectest serve "
            "--draft-url`) or a network is assumed (`spectest report --network-ms`): each "
            "round pays the network time once, whatever K is, so the formula becomes "
            "(1 + Σ_{i<K} p_i) / (1 + c·K + ν) with ν = network ms per round ÷ the target "
            "step; c is derived with the measured network time taken out. \"measured\" is "
            "the server's `spec_decode_draft_network_seconds` per round; \"assumed\" the "
            "flag's value.")
    if not all(a.plausible for a in advice):
        blocks.append("\"costs implausible\": at that load the speculative round measured "
                      "cheaper than a plain target round, which cannot be — the two arms ran "
                      "under different background load. Do not trust that row's K.")
    if figure is not None:
        blocks.append(Image(figure, "Predicted speedup vs K per concurrency: ★ best K, × "
                                    "measured at the K that ran, ◆ the advised policy run."))
    blocks.append("`k_advice.csv` has this table; `k_profile.json` is the advice pooled over "
                  "the workloads, ready for `spectest serve --k-policy goodput --profile "
                  "k_profile.json`.")
    return Section("K advisor", blocks)


STEP_COLUMNS = (("workload", "workload", None), ("arm", "arm", None), ("c", "concurrency", "g"),
                ("req", "requests", "g"), ("fail", "failures", "g"),
                ("TTFT p50", "ttft_p50_ms", ".0f"), ("TTFT p99", "ttft_p99_ms", ".0f"),
                ("TPOT p50", "tpot_p50_ms", ".1f"), ("±95%", "tpot_ci", ".0%"),
                ("TPOT p99", "tpot_p99_ms", ".1f"),
                ("E2EL p99", "e2el_p99_ms", ".0f"), ("tok/s", "output_tokens_per_s", ".0f"),
                ("±95%", "tokens_ci", ".0%"), ("± windows", "output_tokens_per_s_rse", ".0%"),
                ("goodput", "goodput_rps", ".2f"),
                ("accept", "acceptance_rate", ".2f"), ("len", "mean_accepted_length", ".2f"),
                ("K", "k", ".3g"), ("looks", "looks", "g"), ("load", "loadavg", ".1f"))


def steps_section(sweep: Sweep) -> Section:
    t = sweep.table.sort_values(["workload", "concurrency", "arm"], key=lambda s: s.map(
        {w: i for i, w in enumerate(sweep.workloads)}) if s.name == "workload" else s)
    z = (t.interval_z.astype(float).fillna(ev.Z) if "interval_z" in t
         else pd.Series(ev.Z, index=t.index))
    t = t.assign(tpot_ci=(z * t.tpot_p50_log_se.astype(float)).map(_upper),
                 tokens_ci=(z * t.output_tokens_per_s_log_se.astype(float)).map(_upper))
    rows = [[str(r[col]) if spec is None else fmt(r[col], spec) for _, col, spec in STEP_COLUMNS]
            for _, r in t.iterrows()]
    return Section("Per-step measurements", [
        f"Latencies in ms. ±95% is the upper half of the step's interval (over its requests, at "
        f"its critical value z; – in an old steps.csv); ± windows is the relative standard "
        f"error of throughput across the measured windows; looks: how many times the step "
        f"was measured (decisive steps). Every column is in `{STEPS_CSV}`; each step's "
        f"requests are under `runs/`.",
        Table([h for h, _, _ in STEP_COLUMNS], rows)])


def _upper(half: float) -> float:
    return math.exp(half) - 1 if math.isfinite(half) else float("nan")


def busy_machine(machine: dict, t: pd.DataFrame) -> str:
    """The machine line, with a warning when other work competed with the sweep."""
    cpus = machine.get("cpus") or 0
    loads = [float(x) for x in t.get("loadavg", pd.Series(dtype=float)).dropna()]
    loads += [float((machine.get("loadavg_at_start") or [0])[0])]
    text = (f"Machine: {cpus} CPUs; 1-minute load average {min(loads):.1f}–{max(loads):.1f} "
            f"during the sweep (its own server and client count for about 2 when embedded).")
    if cpus and max(loads) > cpus + 2:
        text += (f" **The machine was busy with other work (load up to {max(loads):.1f} on "
                 f"{cpus} CPUs): differences between arms of a few tens of percent may be "
                 f"noise; re-run on a quiet machine or with longer --step-time.**")
    return text


def load_generator(t: pd.DataFrame) -> str:
    """The load generator's own CPU: '' for steps.csv files without it, a warning naming the
    steps where it was near saturation (their latencies are partly the client's)."""
    if "client_cpu" not in t or t.client_cpu.dropna().empty:
        return ""
    shares = t.client_cpu.astype(float)
    hot = t[shares >= cpu.SATURATED]
    if hot.empty:
        return (f"Load generator: the busiest Locust process used at most {shares.max():.0%} "
                f"of a core in any step (flagged at {cpu.SATURATED:.0%}): it had headroom.")
    where = ", ".join(f"{r.workload} {r.arm} c={r.concurrency:g} ({float(r.client_cpu):.0%})"
                      for r in hot.itertuples())
    return (f"**Load generator saturated in {len(hot)} step(s): {where}. Latencies measured "
            f"there include the client's own queueing; {cpu.ADVICE}.**")


def _server(info: dict) -> str:
    server, hosts = info.get("server") or {}, info.get("hosts") or {}
    cfg = info.get("config") or {}
    if server.get("embedded"):
        where = (" in its own `spectest serve-draft` process over loopback HTTP "
                 "(disaggregated)" if cfg.get("disaggregated") else "")
        return (f"bundled `spectest serve` (model {server.get('model', '?')}, draft "
                f"{cfg.get('draft', '?')}{where}, K={cfg.get('k', '?')}), one server for both "
                f"arms switched per request")
    if hosts.get("base") and hosts.get("base") != hosts.get("spec"):
        advised = (f", and the advised configuration at {hosts['spec-advised']}"
                   if hosts.get("spec-advised") else "")
        return f"candidate {hosts.get('spec')} vs baseline {hosts.get('base')}{advised}"
    return f"{hosts.get('spec', '?')} (both arms, switched per request)"
