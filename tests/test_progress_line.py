"""`synthwatch run`'s progress and completion lines (#37): the progress counts to what the run can reach (a cap of
10,000 on 3 prompts counts to 3, not to 10,000), and the completion line says its counts once."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from conftest import run_cli


def test_the_progress_counts_to_what_the_dataset_can_reach_and_the_end_is_said_once(tmp_path: Path, sim: Any,
                                                                                    prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_tokens="5", content_tokens="5")
    proc = run_cli("run", "--dataset", str(prompts(3)), "--base-url", url, "--model", "sim-reasoner", "--db",
                   str(tmp_path / "p.db"), "--name", "small", "--cap", "10000", "--samples-per-prompt", "2")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("small [")]
    assert lines, proc.stderr
    for ln in lines:
        m = re.search(r" ok (\d+)/(\d+) ", ln)
        assert m and int(m.group(2)) == 6, ln  # 3 prompts x 2 samples, not the cap
    end = proc.stderr.strip().splitlines()[-1]
    assert end == "run 'small' completed: 6 ok, 0 errors, 0 timeouts, 0 pending — all prompts processed", end


def test_a_cap_below_the_dataset_is_the_target(tmp_path: Path, sim: Any, prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_tokens="5", content_tokens="5")
    proc = run_cli("run", "--dataset", str(prompts(5)), "--base-url", url, "--model", "sim-reasoner", "--db",
                   str(tmp_path / "p.db"), "--name", "capped", "--cap", "2", "--log-json", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr
    ticks = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert ticks and all(t["target"] == 2 for t in ticks), ticks[:3]
    assert proc.stderr.strip().splitlines()[-1].startswith("run 'capped' completed: 2 ok"), proc.stderr
