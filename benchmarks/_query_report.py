"""bench_query's report: the paired ratio interval and the printed table."""

from __future__ import annotations

import statistics
from typing import Any

from _query_measure import Run, pct  # sibling module; benchmarks run as scripts

TARGET_RATIO = 1.02


TARGET_DURABLE_P99_S = 1.0


# Student's t, two-sided 95% (0.975 quantile) by degrees of freedom; 2.0 past the table (df > 30: 1.96-2.04).
_T975 = [12.71, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]




def paired_ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    """(geometric mean, low, high): a 95% t interval of paired ratios on the log scale."""
    import math

    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), float("nan"), float("nan")
    t = _T975[len(logs) - 2] if len(logs) - 1 <= len(_T975) else 2.0
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def report(result: dict[str, Any], failures: list[str]) -> None:
    partitions, rounds, latency = result["partitions"], result["rounds"], result["latency"]
    others = [side for side in result["sides"] if side != "without"]
    without = [got["without"] for got in rounds]

    def p99(run: Run) -> float:
        return pct(run.batch_ms, 0.99)

    # Per run: its p50, p99, records/s. Per side: the median over rounds. Ratio: of those medians,
    # with the per-round ratios' range beside it. Records/s ratios are without / with (> 1: slower).
    figures = [
        ("batch p50 ms", Run.p50.fget, False, True),
        ("batch p99 ms", p99, False, False),
        ("records/s (first to last batch)", Run.rps_span.fget, True, True),
        ("records/s (sum of batch times)", Run.rps_batches.fget, True, False),
        ("batch 0 ms (Kafka consumers made)", lambda r: r.first_ms, False, False),
    ]
    batches = len(without[0].batch_ms)
    print(f"\n{partitions} partitions: {len(rounds)} rounds; each run: batch 0, then {batches} micro-batches "
          f"of {without[0].rows // batches:,} records (figures: those {batches}, median of the rounds)")
    loads = [r.foreign_cores for got in rounds for r in got.values() if r.foreign_cores is not None]
    if loads:
        print(f"other work on the machine during these runs: median {statistics.median(loads):.2f}, "
              f"max {max(loads):.2f} CPU cores; {result['discarded']} round(s) discarded for more than "
              f"{result['max_foreign']} cores")
    paired: list[tuple[str, str, list[float]]] = []
    for side in others:  # "bridge" (PySpark's listener bus + the py4j fetch only) is shown, never held
        held_side = side == "with"
        runs = [got[side] for got in rounds]
        print(f"{'':>34} {'without':>9} {side:>9} {'ratio':>7}  {'rounds min-max':<13} {'target':>8}")
        for label, get, inverse, held in figures:
            held = held and held_side
            a = statistics.median(get(r) for r in without)
            b = statistics.median(get(r) for r in runs)
            ratio = a / b if inverse else b / a
            per_round = [get(got["without"]) / get(got[side]) if inverse else get(got[side]) / get(got["without"])
                         for got in rounds]
            print(f"{label:>34} {a:>9,.0f} {b:>9,.0f} {ratio:>6.3f}x  "
                  f"{f'{min(per_round):.3f}-{max(per_round):.3f}':<13} {f'<= {TARGET_RATIO}x' if held else '-':>8}")
            if held and ratio > TARGET_RATIO:
                failures.append(f"{partitions} partitions: {label} ratio {ratio:.3f}x (target <= {TARGET_RATIO}x)")
            if label in ("batch p50 ms", "records/s (first to last batch)"):
                paired.append((side, label, per_round))
        if all(r.cpu_s for got in rounds for r in got.values()):
            n = len(without[0].batch_ids)  # the whole run, batch 0 included
            split = []
            for key in ("jvm", "python", "db"):
                a = statistics.median(r.cpu_s[key] for r in without) / n * 1000
                b = statistics.median(r.cpu_s[key] for r in runs) / n * 1000
                split.append(f"{key} {a:.1f} -> {b:.1f}")
            print(f"{f'CPU ms per batch, without -> {side}':>34}  {', '.join(split)} (whole run / batches, median)")
        callbacks = [r.callback_p99_ms for r in runs + (latency if held_side else [])
                     if r.callback_p99_ms is not None]
        if callbacks:
            print(f"{'listener callback p99 ms':>34} {'':>9} {statistics.median(callbacks):>9.2f} {'':>7}  "
                  f"median of runs, max {max(callbacks):.2f} (py4j fetch of the JSON included)")
    # The effect with its uncertainty: each round is a pair (one run without, one with, run back to
    # back in alternating order), so the per-round ratios are the paired samples; their geometric
    # mean with a 95% t interval on the log scale says what the listener costs and how sure that is.
    for side, label, per_round in paired:
        mean, lo, hi = paired_ratio_interval(per_round)
        print(f"{f'paired {side}/without, {label}':>34}  {mean:.3f}x, 95% CI {lo:.3f}-{hi:.3f}x "
              f"({len(per_round)} rounds; geometric mean of the per-round ratios)")
    durable = [s for r in latency for s in r.durable_s.values()]
    segments = [
        ("commit -> trigger end (Spark)", [r.ended_s[b] for r in latency for b in r.durable_s],
         "commit file mtime -> progress end"),
        ("trigger end -> callback has JSON", [r.received_s[b] - r.ended_s[b] for r in latency for b in r.durable_s],
         "listener bus + py4j fetch"),
        ("callback -> durable (ours + PG)", [r.durable_s[b] - r.received_s[b] for r in latency for b in r.durable_s],
         "queue, writer, COMMIT, notify"),
    ]
    for label, values, note in segments:
        if values:
            print(f"{label:>34} {pct(values, 0.5) * 1000:>9.1f} {pct(values, 0.99) * 1000:>9.1f} {'':>7}  "
                  f"p50 / p99 ms: {note}")
    if durable:
        d50, d99 = pct(durable, 0.5), pct(durable, 0.99)
        print(f"{'commit -> durable p50 / p99 ms':>34} {d50 * 1000:>9.1f} {d99 * 1000:>9.1f} "
              f"{d99 / TARGET_DURABLE_P99_S:>6.3f}x  {f'{len(durable)} batches':<13} {'< 1 s':>8}")
        if d99 >= TARGET_DURABLE_P99_S:
            failures.append(f"{partitions} partitions: commit -> durable p99 {d99 * 1000:.0f} ms (target < 1 s)")
