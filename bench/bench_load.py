"""Dashboard responsiveness under load: a worker writing at its maximum rate and 20 readers polling.

Target (issue 8): while a `synthwatch run` process writes into the SQLite file as fast as it can (the simulator
sends every token at once, short answers) and 20 browser-like readers poll the run page's fragments, each
fragment answers with p95 under 200 ms, no 5xx, and no "database is locked" reaches a reader. The same readers
with the worker paused give the baseline; the ratios show what the writer costs.

    python -m bench load            # 20 s per phase, 400,000 prompts available to the writer
    python -m bench --quick load    # 3 s per phase: seconds, used by tests/test_bench_load_smoke.py

Everything is a real process over real HTTP: the simulator (`synthwatch simulate`), the worker (`synthwatch run`)
and the dashboard (`synthwatch serve`, uvicorn), each in its own process; readers are threads with their own
keep-alive connection, each polling every fragment once per second as the run page's timers do.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

READERS = 20
TARGET_P95_MS = 200.0
POLL_S = 1.0


def _fragments(page_html: str, run_id: int) -> dict[str, str]:
    """The live widgets' URLs: every hx-get of the run page polled with `every` (templates/run.html, _run_*.html)."""
    import html

    out: dict[str, str] = {}
    for tag in re.findall(r"<[^>]*hx-get=[^>]*>", page_html):
        m = re.search(r'hx-get="([^"]+)"', tag)
        if not m or "hx-trigger=\"every" not in tag:
            continue
        url = html.unescape(m.group(1))
        name = url.removeprefix(f"/runs/{run_id}/").split("?")[0].replace("/", " ")
        out.setdefault(name, url)
    return out


def _start(args: list[str], pattern: str, stream: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "synthwatch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = pipe.readline()
        if not line and proc.poll() is not None:
            break
        m = re.search(pattern, line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError(f"synthwatch {args[0]} did not start")


def _poll(url: str, paths: dict[str, str], stop: threading.Event, out: dict[str, list[float]],
          bad: list[str], lock: threading.Lock) -> None:
    import httpx

    with httpx.Client(base_url=url, timeout=30) as c:
        while not stop.is_set():
            tick = time.monotonic()
            for name, path in paths.items():
                t = time.perf_counter()
                try:
                    r = c.get(path, headers={"HX-Request": "true"})
                    ms = (time.perf_counter() - t) * 1000
                    problem = f"{name}: HTTP {r.status_code}" if r.status_code >= 400 else None
                    if "database is locked" in r.text:
                        problem = f"{name}: 'database is locked' in the response"
                except httpx.HTTPError as exc:
                    ms, problem = (time.perf_counter() - t) * 1000, f"{name}: {exc!r}"
                with lock:
                    out[name].append(ms)
                    if problem:
                        bad.append(problem)
            stop.wait(max(0.0, POLL_S - (time.monotonic() - tick)))


def _phase(url: str, paths: dict[str, str], seconds: float) -> tuple[dict[str, list[float]], list[str]]:
    out: dict[str, list[float]] = {name: [] for name in paths}
    bad: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    threads = [threading.Thread(target=_poll, args=(url, paths, stop, out, bad, lock), daemon=True)
               for _ in range(READERS)]
    for t in threads:
        t.start()
        time.sleep(POLL_S / READERS)  # readers start spread over one poll interval, as real tabs would
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(60)
    return out, bad


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _n_ok(c: Any, run_id: int) -> int:
    return int(c.get(f"/api/runs/{run_id}").json()["n_ok"])


def measure(quick: bool) -> dict[str, Any]:
    import httpx

    seconds = 3.0 if quick else 20.0
    n_prompts = 20_000 if quick else 400_000
    results: dict[str, Any] = {"readers": READERS, "seconds": seconds}
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "load.db"
        prompts = Path(tmp) / "prompts.jsonl"
        with prompts.open("w") as fh:
            for i in range(n_prompts):
                fh.write(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + {i % 97}?"}]}) + "\n")

        def stop_proc(p: subprocess.Popen[str]) -> None:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)

        sim, base_url = _start(["simulate", "--port", "0", "--tokens-per-s", "0", "--reasoning-tokens", "16-48",
                                "--content-tokens", "8-24", "--seed", "5"], r"(http://\S+/v1)", "stdout")
        stack.callback(stop_proc, sim)
        name = "load"
        worker = subprocess.Popen(
            [sys.executable, "-m", "synthwatch", "run", "--db", str(db), "--dataset", str(prompts), "--base-url",
             base_url, "--model", "sim-reasoner", "--name", name, "--concurrency", "64", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        stack.callback(stop_proc, worker)
        deadline = time.monotonic() + 60
        while not db.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        dash, url = _start(["serve", "--db", str(db), "--port", "0"], r"(http://\S+?)/runs", "stderr")
        stack.callback(stop_proc, dash)
        with httpx.Client(base_url=url, timeout=30) as c:
            run_id = None
            while time.monotonic() < deadline:
                runs = [r for r in c.get("/api/runs").json()["runs"] if r["name"] == name and r["n_ok"] > 100]
                if runs:
                    run_id = runs[0]["id"]
                    break
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited: {worker.stderr.read()[-2000:] if worker.stderr else ''}")
                time.sleep(0.2)
            if run_id is None:
                raise RuntimeError("the worker did not get going within 60 s")
            paths = _fragments(c.get(f"/runs/{run_id}").text, run_id)
            if "stats" not in paths:
                raise RuntimeError(f"the run page polls no stats fragment: {paths}")
            for path in paths.values():
                c.get(path, headers={"HX-Request": "true"}).raise_for_status()

            before, t0 = _n_ok(c, run_id), time.monotonic()
            loaded, bad_loaded = _phase(url, paths, seconds)
            written = _n_ok(c, run_id) - before
            results["writes_per_s"] = written / (time.monotonic() - t0)
            results["worker_finished_early"] = worker.poll() is not None

            ctl = subprocess.run([sys.executable, "-m", "synthwatch", "control", "--db", str(db), name, "pause"],
                                 capture_output=True, text=True, timeout=60)
            if ctl.returncode != 0:
                raise RuntimeError(f"pause failed: {ctl.stderr}")
            time.sleep(2.0)  # in-flight requests land, the writer goes idle
            idle_before = _n_ok(c, run_id)
            base, bad_base = _phase(url, paths, seconds)
            results["writes_during_baseline"] = _n_ok(c, run_id) - idle_before

    rows = []
    for name in paths:
        row: dict[str, Any] = {"fragment": name, "n": len(loaded[name])}
        for label, data in (("load", loaded[name]), ("idle", base[name])):
            row[f"{label}_p50_ms"] = statistics.median(data) if data else float("nan")
            row[f"{label}_p95_ms"] = _pct(data, 0.95)
            row[f"{label}_p99_ms"] = _pct(data, 0.99)
        row["p95_ratio"] = row["load_p95_ms"] / row["idle_p95_ms"] if row["idle_p95_ms"] else float("nan")
        rows.append(row)
    results["rows"] = rows
    results["problems_load"] = bad_loaded
    results["problems_idle"] = bad_base
    results["ok"] = (not bad_loaded and not bad_base and all(r["load_p95_ms"] < TARGET_P95_MS for r in rows))
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "## Dashboard under load (bench/bench_load.py)",
        "",
        f"{results['readers']} readers each poll every run-page fragment once per second for {results['seconds']:.0f} s"
        f" while a `synthwatch run` process writes at its maximum rate ({results['writes_per_s']:.0f} records/s"
        " into SQLite, simulator sending every token at once); baseline: the same readers with the worker paused"
        f" ({results['writes_during_baseline']} records written then). Target: p95 < {TARGET_P95_MS:.0f} ms per"
        " fragment, no error status, no \"database is locked\".",
        "",
        "| fragment | requests | p50 load / idle (ms) | p95 load / idle (ms) | p99 load / idle (ms) | p95 ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        lines.append(f"| {r['fragment']} | {r['n']} | {r['load_p50_ms']:.1f} / {r['idle_p50_ms']:.1f} | "
                     f"{r['load_p95_ms']:.1f} / {r['idle_p95_ms']:.1f} | {r['load_p99_ms']:.1f} / "
                     f"{r['idle_p99_ms']:.1f} | {r['p95_ratio']:.2f} |")
    problems = results["problems_load"] + results["problems_idle"]
    lines += ["", f"Error (>= 400) / locked responses: {len(problems)}" + (f" (first: {problems[0]})" if problems else ""),
              f"Target {'met' if results['ok'] else 'MISSED'}."]
    return "\n".join(lines)


def main(quick: bool = False) -> Any:
    """Full mode: print, record in docs/benchmarks.md, return 0 (target met) or 1. Quick mode: return the results."""
    results = measure(quick)
    text = markdown(results)
    print(text, flush=True)
    if quick:
        return results
    from bench import write_section

    write_section("load", text)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    out = main(quick="--quick" in sys.argv)
    sys.exit(out if isinstance(out, int) else 0)
