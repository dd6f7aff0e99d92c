"""Worker at scale: 2,048 slow streams held at once by one worker on one core.

The simulator paces every stream at 30 tokens/s for 8,000 tokens (about 4.5 minutes each), like a
busy vLLM server; the worker runs with concurrency 2,048 and the default idle timeout (60 s), so
a stream starved by the worker's own event loop would show up as an idle timeout. Reported:
records not ok (spurious timeouts and errors; the target is 0), the worker's resident memory
(peak of /proc/self VmRSS sampled every 0.5 s; target < 500 MB), CPU per streamed token, and how
many streams the simulator saw at once. Then the same run again with the checks on streams in flight and the live
view's snapshots off, and their share of the worker's CPU (#36 item 5: target ≤ 5 %).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import load_average, target
from bench.clients import (
    ClientChild,
    SimProcess,
    fmt,
    pinning_note,
    render,
    rss_bytes,
    workdir,
    write_dataset,
    write_section,
)

RSS_LIMIT_MB = 500
TOKEN_US_LIMIT = 8.0  # CPU per streamed token: 2,048 streams x 30 tokens/s then take at most half of one core (#39)
FULL = {"streams": 2048, "tokens_per_s": 30, "reasoning": 6000, "content": 2000}
QUICK = {"streams": 64, "tokens_per_s": 30, "reasoning": 20, "content": 10}
MID = {"streams": 512, "tokens_per_s": 30, "reasoning": 1500, "content": 500}  # for A/B runs of a few minutes
# 10,000 streams in one worker (#39): slower and shorter streams, so that one simulator core can pace them all
TEN_K = {"streams": 10000, "tokens_per_s": 2, "reasoning": 300, "content": 100}
# the A/B size of #36 item 5 and of the read pacing (#39): the full stream count, 50 s of pacing
SHORT = {"streams": 2048, "tokens_per_s": 30, "reasoning": 1125, "content": 375}
SIZES = {"full": FULL, "quick": QUICK, "mid": MID, "short": SHORT, "10k": TEN_K}
DISTINCT = 16  # the simulator keeps each distinct reply; 2,048 distinct 8,000-token replies would cost it GBs


def deadline_s(size: dict[str, int]) -> float:
    """How long the worker may take before it is stopped: 1.5 times the pacing, plus a minute."""
    return 1.5 * (size["reasoning"] + size["content"]) / size["tokens_per_s"] + 60


def sim_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.rstrip("/") + "/sim/stats", timeout=10) as resp:  # noqa: S310 (local)
        stats: dict[str, Any] = json.loads(resp.read())
        return stats


# The A/B of #36 item 5: the checks on streams in flight and the live view's snapshots, both off (process settings)
LIVE_OFF = {"inflight_checks": "false", "live_streams_refresh_ms": "0"}
LIVE_COST_LIMIT = 0.05  # their share of the worker's CPU at 2,048 streams


def run(size: dict[str, int], log: Any = sys.stderr, settings: dict[str, str] | None = None, condition: str = "quiet",
        trace_top: int = 0, quota_share: float = 0.5) -> dict[str, Any]:
    """One scale run; ``settings`` are process settings for this run only (the A/B of LIVE_OFF), ``condition`` one
    of bench.load_conditions.CONDITIONS, ``trace_top`` > 0 traces the worker's allocations (tracemalloc) and reports
    its largest holders at the peak."""
    from bench.clients import CLIENT_CORE, PINNED
    from bench.load_conditions import condition as host_condition
    from bench.load_conditions import loadavg

    n = size["streams"]
    sim = SimProcess(tokens_per_s=size["tokens_per_s"], reasoning_tokens=size["reasoning"],
                     content_tokens=size["content"])
    child = ClientChild()
    try:
        with workdir() as tmp:
            data = Path(tmp)
            dataset = write_dataset(data / "prompts.jsonl", n, DISTINCT)
            print(f"  scale bench: {n} streams × {size['reasoning'] + size['content']} tokens at "
                  f"{size['tokens_per_s']} tokens/s (≈{(size['reasoning'] + size['content']) / size['tokens_per_s']:.0f}"
                  f" s per stream)", file=log, flush=True)
            sim0 = sim.cpu_s()
            with host_condition(condition, child.pid, CLIENT_CORE if PINNED else None, quota_share) as what:
                print(f"  scale bench: condition {condition}: {what}; load {loadavg()}", file=log, flush=True)
                r = child.ask(kind="worker", base_url=sim.url, dataset=str(dataset), db=str(data / "scale.db"),
                              concurrency=n, stream=True, idle_timeout_s=60.0, sample_rss=True,
                              deadline_s=deadline_s(size), settings=settings or {}, trace_top=trace_top)
                r["load_end"] = loadavg()
            r["condition"] = f"{condition}: {what}"
            r["sim_busy"] = (sim.cpu_s() - sim0) / r["elapsed_s"]
            r["sim_rss_mb"] = rss_bytes(sim.proc.pid) / 2**20
            r["sim"] = sim_stats(sim.url)
    finally:
        child.close()
        sim.close()
    r["expected_tokens"] = n * (size["reasoning"] + size["content"])
    r["cpu_us_per_token"] = r["cpu_s"] / max(r["tokens"], 1) * 1e6
    r["load"] = load_average()
    print(f"  scale bench{' (' + ', '.join(f'{k}={v}' for k, v in settings.items()) + ')' if settings else ''}: "
          f"{r['ok']} ok, {r['failed']} not ok ({r['unfinished']} unfinished) in {r['elapsed_s']:.0f} s, peak RSS "
          f"{r['peak_rss_mb']:.0f} MB, {r['cpu_us_per_token']:.1f} µs CPU per token (load {r['load_end']})", file=log,
          flush=True)
    for line in r.get("holders") or []:
        print(f"    {line}", file=log, flush=True)
    return r


def live_cost(on: dict[str, Any], off: dict[str, Any]) -> float:
    """The in-flight checks' and snapshots' share of the worker's CPU: per streamed token, on against off."""
    return (on["cpu_us_per_token"] - off["cpu_us_per_token"]) / on["cpu_us_per_token"]


def table(r: dict[str, Any], size: dict[str, int], off: dict[str, Any] | None = None) -> dict[str, Any]:
    n = size["streams"]
    pacing_s = (size["reasoning"] + size["content"]) / size["tokens_per_s"]
    held = r["sim"].get("max_in_flight", 0)
    passed = r["failed"] == 0 and r["ok"] == n and r["peak_rss_mb"] < RSS_LIMIT_MB and held >= n
    errors = r["failed"] - r["unfinished"]
    token_met = r["cpu_us_per_token"] <= TOKEN_US_LIMIT
    target("scale", f"{n} streams held at once, none failed", f"{held} held, {r['ok']} ok, {r['failed']} not ok",
           f"{n} held, {n} ok", r["failed"] == 0 and r["ok"] == n and held >= n)
    target("scale", "worker peak RSS", f"{r['peak_rss_mb']:.0f} MB", f"< {RSS_LIMIT_MB} MB",
           r["peak_rss_mb"] < RSS_LIMIT_MB)
    target("scale", "worker CPU per streamed token", f"{r['cpu_us_per_token']:.1f} µs", f"≤ {TOKEN_US_LIMIT:g} µs",
           token_met, needs_core=True)
    rows = [
        ["streams (concurrency)", fmt(n), ""],
        ["streams the simulator had open at once (max)", fmt(held), f"all {n}"],
        ["records ok", fmt(r["ok"]), f"{n}"],
        ["records failed (spurious idle timeouts, errors)", fmt(errors), "0"],
        ["records unfinished when stopped (worker fell behind)", fmt(r["unfinished"]),
         f"0 (stopped after {deadline_s(size):.0f} s)"],
        ["timeouts", fmt(r["timeouts"]), "0"],
        ["tokens streamed (usage)", fmt(r["tokens"]), "≈ " + fmt(r["expected_tokens"])],
        ["chunks streamed", fmt(r["chunks"]), ""],
        ["elapsed (worker start to last commit)", f"{r['elapsed_s']:.0f} s",
         f"≥ {pacing_s:.0f} s (pacing)"],
        ["worker resident memory, peak (VmRSS)", f"{r['peak_rss_mb']:.0f} MB", f"< {RSS_LIMIT_MB} MB"],
        ["worker CPU", f"{r['cpu_s']:.1f} s ({r['cpu_s'] / r['elapsed_s']:.0%} of its core)", ""],
        ["worker CPU per streamed token", f"{r['cpu_us_per_token']:.1f} µs",
         f"≤ {TOKEN_US_LIMIT:g} µs: {'met' if token_met else '**missed**'} (needs a core to itself; load average "
         f"{r['load']} at the end)"],
        ["worker CPU over the pacing time (share of one core needed to keep up)", f"{r['cpu_s'] / pacing_s:.0%}",
         "< 100%"],
        ["simulator core busy", f"{r['sim_busy']:.0%}", ""],
    ]
    if off is not None:
        cost = live_cost(r, off)
        met = cost <= LIVE_COST_LIMIT
        target("scale", "in-flight checks + live-view snapshots, share of the worker's CPU", f"{cost:.1%}",
               f"≤ {LIVE_COST_LIMIT:.0%}", met, needs_core=True)
        rows += [
            ["same run with the in-flight checks and the snapshots off (`SYNTHWATCH_INFLIGHT_CHECKS=false`, "
             "`SYNTHWATCH_LIVE_STREAMS_REFRESH_MS=0`): CPU per streamed token",
             f"{off['cpu_us_per_token']:.1f} µs ({off['ok']} ok, {off['failed']} not ok; load average {off['load']})",
             ""],
            ["in-flight checks and snapshots: their share of the worker's CPU (on − off) / on",
             f"{cost:.1%}", f"≤ {LIVE_COST_LIMIT:.0%}: {'met' if met else '**missed**'}"],
        ]
    rows += [
        ["target met (all held, none failed, memory)", "yes" if passed else "**no**", ""],
    ]
    text = (
        f"One worker (`RunWorker` with the checks' writer hooks, SQLite WAL, idle timeout 60 s) holds {n} "
        f"concurrent streams from `synthwatch simulate --tokens-per-s {size['tokens_per_s']} --reasoning-tokens "
        f"{size['reasoning']} --content-tokens {size['content']}`. {pinning_note()}. Resident memory is the peak "
        f"of the worker process's VmRSS (interpreter, imports, SQLite cache included), sampled every 0.5 s. When "
        f"the worker gets less than the share of its core it needs (the machine is shared), streams finish later "
        f"than the pacing and the unread bytes wait in socket and client buffers; no idle timeout fires because "
        f"data is always waiting."
    )
    return {"id": "worker_at_scale", "title": "Worker at scale", "text": text,
            "columns": ["measure", "value", "target / expected"], "rows": rows, "passed": passed}


def main(quick: bool = False) -> list[dict[str, Any]]:
    size = QUICK if quick else FULL
    t0 = time.monotonic()
    on = run(size)
    off = run(size, settings=LIVE_OFF)  # the same size right after: the A/B of their cost (#36 item 5)
    result = table(on, size, off)
    result["elapsed_s"] = time.monotonic() - t0
    result["markdown"] = render(result)
    if not quick:  # the smoke test must not rewrite the published figures
        write_section("scale", [result], "python -m bench scale")
    return [result]


def cli(argv: list[str]) -> int:
    """`python -m bench.bench_scale [--size full|quick|mid|short|10k] [--condition C] [--trace N] [--set K=V ...]`:
    one run, its table printed (docs/benchmarks.md is not rewritten)."""
    import argparse

    from bench.load_conditions import CONDITIONS

    p = argparse.ArgumentParser(prog="python -m bench.bench_scale", description=cli.__doc__)
    p.add_argument("--size", choices=sorted(SIZES), default="full")
    p.add_argument("--condition", choices=CONDITIONS, default="quiet")
    p.add_argument("--quota-share", type=float, default=0.5, help="the worker's CPU quota under heavy, in cores")
    p.add_argument("--trace", type=int, default=0, metavar="N", help="trace allocations: the N largest holders")
    p.add_argument("--rss-limit-mb", type=float, default=None, help="the peak RSS target (default 500; 1000 for 10k)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a process setting for this run (synthwatch/settings.py), e.g. stream_read_batch_ms=0")
    a = p.parse_args(argv)
    settings = {}
    for kv in a.set:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            p.error(f"--set {kv!r}: expected KEY=VALUE, e.g. stream_read_batch_ms=0")
        settings[key.strip()] = value.strip()
    size = SIZES[a.size]
    global RSS_LIMIT_MB
    RSS_LIMIT_MB = int(a.rss_limit_mb or (1000 if a.size == "10k" else RSS_LIMIT_MB))
    r = run(size, condition=a.condition, trace_top=a.trace, quota_share=a.quota_share, settings=settings or None)
    result = table(r, size)
    print(render(result))
    print(f"condition: {r['condition']}; load average at the end: {r['load_end']}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    if "--quick" in sys.argv:
        print(json.dumps(main(quick=True), indent=1))
    else:
        sys.exit(cli(sys.argv[1:]))
