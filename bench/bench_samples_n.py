"""k samples per prompt, one request each vs one request with n = k (`samples_in_one_request`, #38 item 4).

Two runs of the real worker over the same prompts against two fresh simulators of the same settings, in this one
process: k single-sample requests per prompt, then one request with n = k per prompt. The simulator models a
prefill as ``ttft_ms`` of waiting before the first token and counts each prefill (``/sim/stats``: ``prefills``,
``prefill_tokens``); it has no prefix cache, so every single-sample request prefills its prompt again. Printed:
prefills, prefilled prompt tokens, time spent prefilling (prefills x ttft_ms) and the wall time of each run, and the
ratios single / n = k. Both runs must end with the same records (sample by sample), or the benchmark fails.

`python -m bench samples_n` (`--quick`: fewer prompts).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from sqlalchemy import text

from bench import write_section
from synthwatch.config import RunConfig
from synthwatch.simulator.config import SimConfig
from synthwatch.simulator.launch import running_in_thread
from synthwatch.sources.load import prepare_run
from synthwatch.store.db import open_engine
from synthwatch.workers.engine import RunWorker

FULL = {"prompts": 64, "k": 4, "ttft_ms": 150, "tokens_per_s": 400, "concurrency": 8}
QUICK = {"prompts": 8, "k": 4, "ttft_ms": 100, "tokens_per_s": 400, "concurrency": 4}
SIM = {"seed": 11, "reasoning_tokens": "20-40", "content_tokens": "5-10"}


def _run(db: Path, data: Path, url: str, name: str, size: dict[str, Any], in_one: bool) -> tuple[float, list[Any]]:
    config = RunConfig.model_validate({
        "name": name, "dataset": {"path": str(data)}, "endpoints": [{"base_url": url}], "model": "sim-reasoner",
        "concurrency": size["concurrency"], "samples_per_prompt": size["k"], "samples_in_one_request": in_one,
        "request_token_ids": True, "flush_interval_ms": 50})
    engine = open_engine(f"sqlite:///{db}")
    with open("/dev/null", "w") as sink:
        run_id, _ = prepare_run(engine, config, out=sink)
    t = time.perf_counter()
    final = asyncio.run(RunWorker(engine, run_id, config).main())
    wall = time.perf_counter() - t
    if final != "completed":
        raise SystemExit(f"the {name} run ended {final}")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT prompt_idx, sample_index, status, finish_reason, content, token_ids_json"
                                 " FROM record WHERE run_id = :r ORDER BY idx"), {"r": run_id}).all()
    engine.dispose()
    return wall, [tuple(r) for r in rows]


def main(quick: bool = False) -> dict[str, Any]:
    size = QUICK if quick else FULL
    out: dict[str, dict[str, Any]] = {}
    records: dict[str, list[Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        with data.open("w") as fh:
            for i in range(size["prompts"]):
                fh.write(orjson.dumps({"id": f"p{i}", "prompt": f"What is {3 + i} + {5 + 7 * i % 89}?"}).decode()
                         + "\n")
        for name, in_one in (("single", False), ("n_equals_k", True)):
            sim = SimConfig(ttft_ms=size["ttft_ms"], tokens_per_s=size["tokens_per_s"], **SIM)
            with running_in_thread(sim) as url:
                wall, records[name] = _run(Path(tmp) / f"{name}.db", data, url, name, size, in_one)
                stats = httpx.get(url.removesuffix("/v1") + "/sim/stats", timeout=10).json()
            out[name] = {"wall_s": wall, "requests": stats["chat_requests"], "prefills": stats["prefills"],
                         "prefill_tokens": stats["prefill_tokens"],
                         "prefill_s": stats["prefills"] * size["ttft_ms"] / 1000}
    if records["single"] != records["n_equals_k"]:
        raise SystemExit("the two runs' records differ")
    s, n = out["single"], out["n_equals_k"]
    rows = [[key, f"{s[key]:,.2f}" if isinstance(s[key], float) else f"{s[key]:,}",
             f"{n[key]:,.2f}" if isinstance(n[key], float) else f"{n[key]:,}", f"{s[key] / n[key]:.2f}x"]
            for key in ("requests", "prefills", "prefill_tokens", "prefill_s", "wall_s")]
    columns = ["", "one request per sample", "one request with n = k", "ratio"]
    lines = [f"### k samples in one request (bench/bench_samples_n.py{', quick' if quick else ''})", "",
             f"{size['prompts']} prompts x k = {size['k']} samples, concurrency {size['concurrency']}, simulator with"
             f" ttft_ms = {size['ttft_ms']} (its prefill) and {size['tokens_per_s']} tokens/s per stream, no prefix"
             f" cache; {len(records['single'])} records in each run, equal sample by sample.", "",
             "| " + " | ".join(columns) + " |", "|---|---:|---:|---:|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    markdown = "\n".join(lines)
    print(markdown)  # noqa: T201 - a benchmark prints its table
    if not quick:
        write_section("samples_n", markdown)
    return {"id": "samples_n", "columns": columns, "rows": rows, "markdown": markdown}
