"""Verifiers warm up before their first record, outside its time budget (#38): math-verify (sympy, the LaTeX
grammar) loads when the check process starts, so a short budget does not turn the first record into an 'error';
a verifier whose library cannot load refuses the run (exit 2, naming it). Real check processes, real SQLite."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import cli_env, run_cli
from sqlalchemy import text
from test_extended_checks import _verdicts, crafted_run

from synthwatch.quality.extended import recheck


def test_the_math_verifiers_first_record_is_not_an_error_under_a_short_budget(engine) -> None:  # type: ignore[no-untyped-def]
    """Loading math-verify takes 0.35 to 0.6 s here (more under load); checking one answer once loaded, ~10 ms. With a
    0.25 s budget the first record was an 'error' while the library loaded inside it."""
    rows = [("q", "So the result is $\\boxed{\\frac{1}{2}}$.", {"answer": "0.5"}),
            ("q", "The final answer is \\boxed{3}.", {"answer": "4"}),
            ("q", "It is $\\boxed{7}$.", {"answer": "7"})]
    run_id, ids = crafted_run(engine, {"verifiers": [{"kind": "math", "reference": "answer", "timeout_s": 0.25}]}, rows)
    recheck(engine, run_id)
    math = _verdicts(engine, run_id, "verify_math")
    assert [math[i].state for i in ids] == ["pass", "fail", "pass"], [math[i].verdict.reason for i in ids]


def test_a_verifier_that_cannot_load_refuses_the_run(tmp_path: Path, sim, db_path) -> None:  # type: ignore[no-untyped-def]
    broken = tmp_path / "site" / "math_verify"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('math_verify is broken here')\n")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(3)))
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"""
name = "mathrun"
model = "sim-reasoner"
[dataset]
path = "{data}"
[[endpoints]]
base_url = "{sim(seed=8, reasoning_tokens="3-5", content_tokens="3-5")}"
[[checks.verifiers]]
kind = "math"
reference = "answer"
""")
    res = run_cli("run", "--config", str(cfg), "--db", str(db_path), "--quiet",
                  env=cli_env(PYTHONPATH=str(tmp_path / "site")))
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "verifier verify_math cannot load" in last and "math_verify is broken here" in last, res.stderr
    from synthwatch.store.db import open_engine

    with open_engine(str(db_path)).connect() as conn:  # refused before any request: no record was sent
        assert conn.execute(text("SELECT COUNT(*) FROM record WHERE status != 'pending'")).scalar() == 0
