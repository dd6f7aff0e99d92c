"""Export at scale: `synthwatch export` of a 1,000,000-record run, in bounded memory.

The database is filled by bench/fill.py (raw executemany; 94 % ok, the rest error/timeout/pending,
2 % truncated) and 1 in 50 ok records is flagged bad. Each export runs as its own child process
(the real CLI, `--quiet`); its peak resident memory is the child's own high-water mark (VmHWM, read by the
child as it exits: `os.wait4`'s ru_maxrss would also count the parent's pages the child was forked from)
and its wall time comes from the parent. The baseline, in a child of the same kind
on the same database, only reads the same rows with the same keyset pages and writes them with
orjson: no selection, no row shaping, no manifest. The ratio export / baseline is what the export's
own work costs; absolute figures move with the machine.

Re-tokenizing (`tokens` without server token ids) renders the chat template twice per record; its
throughput is measured on a small run.

    python -m bench.bench_export [--quick]
    SYNTHWATCH_BENCH_EXPORT_DB=/tmp/export-bench.db python -m bench.bench_export   # keep/reuse the filled DB
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.clients import fmt, render, workdir, write_section

ROOT = Path(__file__).resolve().parent.parent
RSS_LIMIT_MB = 300
FULL = {"records": 1_000_000, "formats": ("messages", "sharegpt", "raw"), "tokens_records": 2000}
QUICK = {"records": 20_000, "formats": ("messages", "raw"), "tokens_records": 100, "quick": True}

BASELINE = r"""
import sys, time, orjson, sqlite3
db, run_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
conn = sqlite3.connect(db)
t0 = time.perf_counter()
last, n = 0, 0
with open(out, "wb") as fh:
    while True:
        cur = conn.execute(
            "SELECT id, idx, source_id, prompt_json, reasoning, content, finish_reason, review, check_flags"
            " FROM record WHERE run_id = ? AND status = 'ok' AND id > ? ORDER BY id LIMIT 5000", (run_id, last))
        keys = [d[0] for d in cur.description]
        rows = [dict(zip(keys, r)) for r in cur.fetchall()]
        if not rows:
            break
        fh.write(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows))
        last = rows[-1]["id"]
        n += len(rows)
print(n, time.perf_counter() - t0)
print("VMHWM_KB", next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")), file=sys.stderr)
"""

# The real CLI, reporting its own peak resident memory (VmHWM of its own address space) on the last stderr line.
CLI = r"""
import sys
from synthwatch.cli import main
try:
    code = main(sys.argv[1:])
finally:
    hwm = next((l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")), "0")
    print("VMHWM_KB", hwm, file=sys.stderr, flush=True)
sys.exit(code)
"""
HWM = 'print("VMHWM_KB", next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")), file=sys.stderr)\n'



def child(cmd: list[str]) -> dict[str, Any]:
    """Run a child to the end: wall time, peak RSS (this child only), exit code, output."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SYNTHWATCH_DB", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read().decode() if proc.stdout else ""
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {err[-2000:]}")
    hwm = [line.split()[1] for line in err.splitlines() if line.startswith("VMHWM_KB ")]
    # ru_maxrss of a child also counts the parent's resident pages it was forked from (Linux keeps the
    # high-water mark across exec), so the child's own VmHWM is the figure; ru_maxrss is kept as a bound.
    return {"elapsed_s": elapsed, "peak_rss_mb": int(hwm[-1]) / 1024 if hwm else usage.ru_maxrss / 1024,
            "ru_maxrss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime, "stdout": out,
            "stderr": err}


def fill_db(db: str, n: int, n_tokens: int) -> dict[str, Any]:
    """Both runs (run in a child process: the parent stays small)."""
    from bench.fill import fill

    t0 = time.perf_counter()
    run_id = fill(db, n, run_name="export-bench", status="completed", seed=1)
    tok_id = fill(db, n_tokens, run_name="export-bench-tokens", status="completed", seed=2)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE record SET review = 'bad', review_reason = 'bench' WHERE run_id = ? AND status = 'ok'"
                     " AND id % 50 = 0", (run_id,))
        # the small run re-tokenizes with the shipped DeepSeek-V4 tokenizer and template (no server ids)
        (raw,) = conn.execute("SELECT config_json FROM run WHERE id = ?", (tok_id,)).fetchone()
        config = json.loads(raw)
        config["tokenizer"] = {"name_or_path": "deepseek-v4", "chat_template": "deepseek-v4"}
        conn.execute("UPDATE run SET config_json = ? WHERE id = ?", (json.dumps(config), tok_id))
    return {"run_id": run_id, "tokens_run_id": tok_id, "fill_s": time.perf_counter() - t0}


def build(db: Path, size: dict[str, Any], log: Any) -> dict[str, Any]:
    """Fill the database in a child, or reuse the one named by $SYNTHWATCH_BENCH_EXPORT_DB when it exists."""
    info_file = db.with_name(db.name + ".runs.json")
    if not info_file.is_file():
        r = child([sys.executable, "-m", "bench.bench_export", "--fill", str(db), str(size["records"]),
                   str(size["tokens_records"])])
        info_file.write_text(r["stdout"].strip().splitlines()[-1])
    info: dict[str, Any] = json.loads(info_file.read_text())
    with sqlite3.connect(db) as conn:
        info["counts"] = dict(conn.execute("SELECT status, COUNT(*) FROM record WHERE run_id = ? GROUP BY status",
                                           (info["run_id"],)).fetchall())
    print(f"  export bench: {size['records']:,} records ({info['counts']}), filled in {info['fill_s']:.0f} s",
          file=log, flush=True)
    return info


def run(size: dict[str, Any], log: Any = sys.stderr) -> dict[str, Any]:
    results: dict[str, Any] = {"exports": []}
    keep = os.environ.get("SYNTHWATCH_BENCH_EXPORT_DB")
    with workdir() as tmp:
        data = Path(tmp)
        db = Path(keep) if keep and not size.get("quick") else data / "export.db"
        info = build(db, size, log)
        run_id = info["run_id"]
        results["counts"] = info["counts"]
        base = child([sys.executable, "-c", BASELINE, str(db), str(run_id), str(data / "baseline.jsonl")])
        n_rows, loop_s = base["stdout"].split()
        base["records"], base["loop_s"] = int(n_rows), float(loop_s)
        base["bytes"] = (data / "baseline.jsonl").stat().st_size
        results["baseline"] = base
        print(f"  export bench: baseline read+dump {base['records']:,} rows in {base['loop_s']:.1f} s, "
              f"peak RSS {base['peak_rss_mb']:.0f} MB", file=log, flush=True)
        jobs = [(f, run_id) for f in size["formats"]] + [("tokens", info["tokens_run_id"])]
        for f, rid in jobs:
            out = data / f"out-{f}.jsonl"
            r = child([sys.executable, "-c", CLI, "export", "--db", str(db), str(rid), "--format", f,
                       "--out", str(out), "--quiet"])
            manifest = json.loads(Path(f"{out}.manifest.json").read_text())
            r.update(format=f if f != "tokens" else "tokens (re-tokenized)", loop_s=manifest["duration_s"],
                     scanned=manifest["counts"]["ok_scanned"], exported=manifest["counts"]["exported"],
                     excluded=manifest["counts"]["excluded"], bytes=out.stat().st_size)
            out.unlink()
            if f == "tokens":
                results["tokens"] = r
            else:
                results["exports"].append(r)
            print(f"  export bench: {r['format']}: {r['scanned']:,} ok records in {r['loop_s']:.1f} s "
                  f"(process {r['elapsed_s']:.1f} s), peak RSS {r['peak_rss_mb']:.0f} MB, excluded {r['excluded']}",
                  file=log, flush=True)
    return results


def table(r: dict[str, Any], size: dict[str, Any]) -> dict[str, Any]:
    base = r["baseline"]
    rows = [["baseline: read the ok rows + orjson, nothing else", fmt(base["records"]), f"{base['loop_s']:.1f} s",
             f"{base['elapsed_s']:.1f} s", fmt(base["records"] / base["loop_s"]), "1.00×",
             f"{base['peak_rss_mb']:.0f} MB", f"{base['bytes'] / 2**20:,.1f} MB"]]
    passed = True
    for e in [*r["exports"], r["tokens"]]:
        is_tokens = e is r["tokens"]
        name = f"`synthwatch export --format {e['format'].split()[0]}`"
        rows.append([name + (" (re-tokenized, small run)" if is_tokens else ""), fmt(e["scanned"]),
                     f"{e['loop_s']:.1f} s", f"{e['elapsed_s']:.1f} s", fmt(e["scanned"] / max(e["loop_s"], 1e-9)),
                     "–" if is_tokens else f"{e['loop_s'] / base['loop_s']:.2f}×", f"{e['peak_rss_mb']:.0f} MB",
                     f"{e['bytes'] / 2**20:,.1f} MB"])
        passed = passed and e["peak_rss_mb"] < RSS_LIMIT_MB and e["scanned"] == (base["records"] if not is_tokens
                                                                                 else e["scanned"])
    ok = r["counts"].get("ok", 0)
    first = r["exports"][0]
    text = (
        f"A run of {size['records']:,} records ({ok:,} ok; the others error, timeout or pending) filled by "
        f"`bench/fill.py`; 1 in 50 ok records flagged bad. Each export is the real CLI (`--quiet`) in its own "
        f"process. *Export time* is the manifest's `duration_s` (reading, selection, shaping, writing, fsync, "
        f"sha256); *process* adds interpreter start-up, imports and opening the database; records/s is per "
        f"export time. Peak memory is that process's own VmHWM (target < {RSS_LIMIT_MB} MB). Selection left out "
        f"{sum(first['excluded'].values()):,} records ({', '.join(f'{k} {v:,}' for k, v in first['excluded'].items())})."
        " The baseline child reads the same keyset pages and writes the rows as they come (no selection, no "
        "shaping, no manifest); × baseline compares export times."
    )
    return {"id": "export_at_scale", "title": "Export at scale", "text": text,
            "columns": ["what", "ok records", "export time", "process", "records/s", "× baseline", "peak RSS",
                        "output"],
            "rows": rows, "passed": passed}


def main(quick: bool = False) -> list[dict[str, Any]]:
    size = QUICK if quick else FULL
    t0 = time.monotonic()
    result = table(run(size), size)
    result["elapsed_s"] = time.monotonic() - t0
    result["markdown"] = render(result)
    if not quick:  # a smoke run must not rewrite the published figures
        write_section("export", [result], "python -m bench export")
    return [result]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fill"]:
        print(json.dumps(fill_db(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    else:
        print(json.dumps(main(quick="--quick" in sys.argv), indent=1))
