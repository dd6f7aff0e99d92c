"""The n = k benchmark (bench/bench_samples_n.py) runs in its quick mode, so that it never rots: both runs end with
equal records, and the simulator's prefills are k times fewer with one request per prompt."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_samples_n_benchmark_quick() -> None:
    from bench import bench_samples_n

    # in a thread of its own: the benchmark calls asyncio.run, and a browser test before this one in the same
    # process leaves Playwright's loop running in the main thread
    with ThreadPoolExecutor(1) as pool:
        table = pool.submit(bench_samples_n.main, quick=True).result()
    rows = {r[0]: r for r in table["rows"]}
    k = bench_samples_n.QUICK["k"]
    assert rows["prefills"][3] == rows["prefill_tokens"][3] == rows["requests"][3] == f"{k:.2f}x"
    assert float(rows["wall_s"][3].removesuffix("x")) > 1  # fewer waits for a prefill: the run ends sooner
    assert table["markdown"].count("\n|") == len(table["rows"]) + 2
