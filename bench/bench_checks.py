"""What each extended check costs per record (#30), against the built-in checks measured in the same run.

Every check runs the code the check processes run (synthwatch.quality.check_pool.run_check, main thread, its
time budget armed) on the same records: answers shaped like the simulator's (a few sentences, a \\boxed{}
answer, a JSON object for the schema verifier). The baseline is the built-in checks of the writer thread
(RecordChecker.check) on the same records. Then:

- the check process's own overhead per record (pipe, pickling, one process) with a trivial TOML rule;
- the near-duplicate index's memory per answer, in a fresh interpreter, at 1,000,000 answers (quick: 20,000):
  datasketch MinHashLSH holding LeanMinHash signatures (what the index keeps of an answer), measured as the
  growth of the process's resident memory.

    python -m bench checks            # 2,000 records per check, the index at 1,000,000 answers
    python -m bench --quick checks    # 200 records, the index at 20,000 answers

The worker's own ratio with the built-in checks only is `python -m bench worker` (unchanged: without an extended
check configured no hook, thread or process is added to the writer).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from synthwatch.check_catalog import CheckSettings
from synthwatch.quality.check_pool import CheckProcess, pool_checks, run_check, view_args
from synthwatch.quality.checks import RecordChecker, RecordView, RunContext

FULL_RECORDS, QUICK_RECORDS = 2_000, 200
FULL_INDEX, QUICK_INDEX = 1_000_000, 20_000

SENTENCES = [
    "First I add the tens, then the units, and carry where the sum passes nine.",
    "The intermediate value is checked by subtracting one addend from the total.",
    "Each step can be verified by reversing the operation that produced it.",
    "Rounding is not needed here because both numbers are whole.",
    "A quick estimate confirms that the magnitude of the result is right.",
]

SETTINGS = {
    "verifiers": [{"kind": "math", "reference": "answer"}, {"kind": "exact", "reference": "answer",
                                                            "answer_regex": r"\\boxed\{([^}]*)\}"},
                  {"kind": "regex", "reference": "pattern"}, {"kind": "choice", "reference": "letter"},
                  {"kind": "json_schema", "reference": "schema"}],
    "user": [{"name": "boxed", "function": "bench.bench_checks:has_boxed"}],
    "rule": [{"name": "has_boxed", "regex": r"\\boxed\{", "min_chars": 20, "max_chars": 20000}],
    "language": {"enabled": True, "expect": "en"},
}


def has_boxed(record: RecordView) -> bool:
    """The user check of the benchmark: the smallest Python function a user would register."""
    return "\\boxed{" in record.content


def records(n: int) -> list[tuple[RecordView, dict[str, Any]]]:
    out = []
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}
    for i in range(n):
        a, b = 3 + i % 97, 5 + (i * 7) % 89
        body = " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(3 + i % 4))
        content = (f"We need {a} + {b}. {body} So the result is $\\boxed{{{a + b}}}$. "
                   f'As JSON: {{"answer": {a + b}}}. The answer is (B).')
        reasoning = f"Let me add {a} and {b}. " + body * 2
        view = RecordView(i + 1, i, "ok", reasoning, content, "stop", 120, 60,
                          messages=[{"role": "user", "content": f"What is {a} + {b}?"}])
        out.append((view, {"answer": str(a + b), "pattern": str(a + b), "letter": "B", "schema": json.dumps(schema)}))
    return out


def per_record_us(fn: Any, recs: list[tuple[RecordView, dict[str, Any]]]) -> float:
    fn(*recs[0])  # warm: models, sympy caches, regex compilation
    t = time.perf_counter()
    for v, row in recs:
        fn(v, row)
    return (time.perf_counter() - t) / len(recs) * 1e6


def index_memory(n: int, num_perm: int) -> dict[str, float]:
    """In a fresh interpreter: resident memory growth and insert time for n answers in the LSH index."""
    code = f"""
import json, os, time
import numpy as np
from datasketch import LeanMinHash, MinHash, MinHashLSH
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
scheme = MinHash(num_perm={num_perm}).scheme
lsh = MinHashLSH(threshold=0.8, num_perm={num_perm})
rng = np.random.default_rng(1)
r0 = rss(); t = time.perf_counter()
for start in range(0, {n}, 100_000):
    hv = rng.integers(0, 2**32 - 1, size=(min(100_000, {n} - start), {num_perm}), dtype=np.uint64)
    for i, row in enumerate(hv):
        lsh.insert(start + i, LeanMinHash(seed=1, hashvalues=row, scheme=scheme))
    del hv  # a large array is returned to the system: only the index stays counted
print(json.dumps({{"bytes": rss() - r0, "insert_us": (time.perf_counter() - t) / {n} * 1e6}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=3600)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {"mb": got["bytes"] / 1e6, "bytes_per_answer": got["bytes"] / n, "insert_us": got["insert_us"]}


def main(quick: bool = False) -> dict[str, Any]:
    n = QUICK_RECORDS if quick else FULL_RECORDS
    recs = records(n)
    settings = CheckSettings.model_validate(SETTINGS)
    checker = RecordChecker(RunContext(1, "bench", settings=CheckSettings.model_validate({})))
    base = per_record_us(lambda v, row: checker.check(v), recs)
    rows: list[tuple[str, float]] = []
    for c in pool_checks(settings):
        rows.append((c.name, per_record_us(lambda v, row, c=c: run_check(c, v, row), recs)))
    from synthwatch.check_extended import NearDuplicateSettings
    from synthwatch.quality.neardup import NearDuplicates

    nd = NearDuplicates(NearDuplicateSettings.model_validate({"enabled": True}))
    rows.append(("near_duplicate", per_record_us(lambda v, row: nd.check(v), recs)))
    # the check process's own cost: a trivial rule, through the pipe, minus the rule itself in-process
    trivial = CheckSettings.model_validate({"rule": [{"name": "tiny", "max_chars": 10**9}]})
    rule = pool_checks(trivial)[0]
    inproc = per_record_us(lambda v, row: run_check(rule, v, row), recs)
    proc = CheckProcess(trivial, [rule.name], 5.0)
    try:
        proc.start()
        items = [(v.record_id, view_args(v), row) for v, row in recs]
        list(proc.run(items[:10]))
        t = time.perf_counter()
        list(proc.run(items))
        piped = (time.perf_counter() - t) / n * 1e6
    finally:
        proc.close()
    print(f"{n} records; built-in checks (writer thread, baseline): {base:.1f} us per record")
    print(f"{'check':<22} {'us/record':>10} {'x built-in':>11}")
    for name, us in rows:
        print(f"{name:<22} {us:>10.1f} {us / base:>10.1f}x")
    print(f"{'check process overhead':<22} {piped - inproc:>10.1f} {(piped - inproc) / base:>10.1f}x"
          f"  (a trivial rule: {piped:.1f} us through the pipe, {inproc:.1f} us in-process)")
    size = QUICK_INDEX if quick else FULL_INDEX
    mem = {p: index_memory(size, p) for p in (64, 32)}
    for p, m in mem.items():
        print(f"near-duplicate index, {size:,} answers, num_perm {p}: {m['mb']:.0f} MB "
              f"({m['bytes_per_answer']:.0f} bytes per answer), insert {m['insert_us']:.1f} us")
    return {"baseline_us": base, "checks": dict(rows), "process_overhead_us": piped - inproc, "index": mem}


if __name__ == "__main__":
    main("--quick" in sys.argv)
