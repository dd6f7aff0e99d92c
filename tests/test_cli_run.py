"""`synthwatch run` as a user runs it: real subprocesses, a real simulator, a real SQLite file."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import HTTP_TIMEOUT_S, cli_env, kill_9_repeatedly, popen_cli, run_cli, wait_http_ready
from sqlalchemy import text
from workerkit import answer_ok, counts, records, run_row, wait_for

from synthwatch.store.db import open_engine


def _toml(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def test_run_from_toml_completes_with_exit_code_0(tmp_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=1)
    db = tmp_path / "x.db"
    cfg = _toml(tmp_path / "run.toml", f"""
name = "toml-run"
model = "sim-reasoner"
concurrency = 4
cap = 15
[dataset]
path = "{prompts(40)}"
[[endpoints]]
base_url = "{url}"
[sampling]
max_tokens = 512
temperature = 0.6
[timeouts]
idle_s = 5
""")
    proc = run_cli("run", "--config", str(cfg), "--db", str(db), "--log-json", check=True)
    assert proc.returncode == 0
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert lines and {"ok", "req_per_s", "in_flight", "timeout_share", "empty_reasoning_share", "eta_s"} <= set(lines[-1])
    assert "completed" in proc.stderr and "15 ok" in proc.stderr
    engine = open_engine(str(db))
    run = run_row(engine, "toml-run")
    assert (run["n_ok"], run["status"]) == (15, "completed")
    snap = json.loads(run["config_json"])
    assert snap["sampling"]["max_tokens"] == 512 and snap["cap"] == 15


@pytest.mark.slow
def test_flags_override_config_and_name_resumes(tmp_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=1)
    db = tmp_path / "x.db"
    data = prompts(30)
    common = ["run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
              "--name", "resumable", "--quiet"]
    assert run_cli(*common, "--cap", "5").returncode == 0
    proc = run_cli(*common, "--cap", "12", check=True)
    assert "resuming run 'resumable'" in proc.stderr
    engine = open_engine(str(db))
    assert counts(engine, run_row(engine, "resumable")["id"]) == {"ok": 12, "pending": 18}


def test_malformed_dataset_lines_are_reported_with_file_and_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "bad.jsonl"
    data.write_text(
        '{"messages": [{"role": "user", "content": "fine"}]}\n'
        '{"messages": [{"role": "user", "content": "fine"}]\n'  # truncated JSON on line 2
        '\n'
        '{"question": "no known field"}\n'  # line 4
    )
    proc = run_cli("run", "--dataset", str(data), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--db", str(tmp_path / "x.db"), "--no-preflight")  # (no endpoint: the dataset is the subject)
    assert proc.returncode == 2
    assert f"{data}:2:" in proc.stderr and f"{data}:4:" in proc.stderr
    assert "Traceback" not in proc.stderr
    # nothing was created: the run refused to start
    engine = open_engine(str(tmp_path / "x.db"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM run")).scalar() == 0


def test_skip_bad_lines_counts_them(tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=1)
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "What is 2 + 2?"}\nnot json\n{"prompt": "What is 3 + 3?"}\n')
    proc = run_cli("run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db",
                   str(tmp_path / "x.db"), "--name", "skip", "--skip-bad-lines", "--quiet", check=True)
    assert "skipped 1 malformed" in proc.stderr and f"{data}:2:" in proc.stderr
    engine = open_engine(str(tmp_path / "x.db"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT line, reason FROM ingest_error")).all()[0][0] == 2
    assert counts(engine, run_row(engine, "skip")["id"]) == {"ok": 2}


def test_bad_config_is_refused_with_the_key_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = _toml(tmp_path / "run.toml", """
model = "m"
concurency = 4
[dataset]
path = "x.jsonl"
[[endpoints]]
base_url = "ftp://nope"
""")
    proc = run_cli("run", "--config", str(cfg), "--db", str(tmp_path / "x.db"))
    assert proc.returncode == 2
    assert "concurency: unknown key" in proc.stderr
    assert "endpoints.0.base_url" in proc.stderr and "not an http(s) URL" in proc.stderr
    proc = run_cli("run", "--dataset", "x.jsonl", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--concurrency", "-3", "--db", str(tmp_path / "x.db"))
    assert proc.returncode == 2 and "must be at least 1" in proc.stderr


def test_missing_api_key_env_is_a_clear_error(tmp_path, prompts) -> None:  # type: ignore[no-untyped-def]
    proc = run_cli("run", "--dataset", str(prompts(2)), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--api-key-env", "SW_TEST_KEY_NOT_SET", "--db", str(tmp_path / "x.db"))
    assert proc.returncode == 2 and "SW_TEST_KEY_NOT_SET is not set" in proc.stderr


def test_sigterm_stops_gracefully_with_exit_code(tmp_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=1, tokens_per_s=50, reasoning_tokens="30", content_tokens="10")
    db = tmp_path / "x.db"
    proc = popen_cli("run", "--dataset", str(prompts(100)), "--base-url", url, "--model", "sim-reasoner",
                     "--db", str(db), "--name", "sig", "--concurrency", "4", "--quiet")
    engine = open_engine(str(db))
    wait_for(lambda: _n_ok(engine, "sig") >= 2, timeout_s=30, what="progress")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err  # stopped
    run = run_row(engine, "sig")
    assert run["status"] == "stopped" and run["n_in_flight"] == 0
    c = counts(engine, run["id"])
    assert c.get("in_flight", 0) == 0 and c["ok"] + c["pending"] == 100


def _n_ok(engine, name: str) -> int:  # type: ignore[no-untyped-def]
    try:
        return run_row(engine, name)["n_ok"]
    except Exception:
        return 0


# Over 30 s (~45 s here): up to 20 real `synthwatch run` processes, each killed with SIGKILL 0.8-2.5 s after it
# starts and the run resumed, at least 8 kills before the run ends: the kills themselves are the time.
@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume(tmp_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """The database is the queue: after any crash the run resumes with nothing lost or doubled."""
    url = sim(seed=11, tokens_per_s=80, reasoning_tokens="10-40", content_tokens="5-15")
    db = tmp_path / "x.db"
    cap = 300
    args = ["run", "--dataset", str(prompts(500)), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
            "--name", "crashy", "--concurrency", "16", "--cap", str(cap), "--quiet"]
    engine = open_engine(str(db))
    kills = kill_9_repeatedly(args, rounds=20, wait_s=(0.8, 2.5), seed=int(os.environ.get("SW_KILL_SEED", "5")),
                              env=cli_env())
    final = popen_cli(*args, env=cli_env())
    out, err = final.communicate(timeout=120)
    assert final.returncode == 0, err
    assert kills >= 8  # crashes at 8+ random moments (how many fit before the run ends depends on the machine)
    run = run_row(engine, "crashy")
    c = counts(engine, run["id"])
    assert c["ok"] == cap == run["n_ok"]
    assert c.get("in_flight", 0) == 0
    ok = records(engine, run["id"], "status = 'ok'")
    assert len({r["idx"] for r in ok}) == cap
    for r in ok:
        assert r["reasoning"] and r["content"] and r["finish_reason"] == "stop" and answer_ok(r)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r"), {"r": run["id"]}).scalar() == 500


@pytest.mark.slow
def test_dashboard_restart_mid_run_leaves_the_run_unaffected(tmp_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    import socket

    import httpx

    url = sim(seed=2, tokens_per_s=200, reasoning_tokens="20", content_tokens="10")
    db = tmp_path / "x.db"
    worker = popen_cli("run", "--dataset", str(prompts(150)), "--base-url", url, "--model", "sim-reasoner",
                       "--db", str(db), "--name", "web-restart", "--concurrency", "4", "--quiet")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def serve_once() -> None:
        web = popen_cli("serve", "--db", str(db), "--port", str(port))
        try:
            wait_http_ready(f"http://127.0.0.1:{port}", web)
            wait_for(lambda: "web-restart" in httpx.get(f"http://127.0.0.1:{port}/api/runs",
                                                        timeout=HTTP_TIMEOUT_S).text, 60, what="the run listed")
        finally:
            web.kill()  # an abrupt end, as a crash would be
            web.wait()

    serve_once()
    serve_once()
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    engine = open_engine(str(db))
    assert counts(engine, run_row(engine, "web-restart")["id"]) == {"ok": 150}


def test_ctrl_c_as_the_run_ends_keeps_its_exit_code(tmp_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C pressed as the run finishes (its last line printed, the process exiting) has nothing left to stop:
    the exit code stays the run's (0, completed), not death by SIGINT or 130."""
    url = sim(seed=3, tokens_per_s=0, reasoning_tokens="5", content_tokens="5")
    proc = popen_cli("run", "--dataset", str(prompts(20)), "--base-url", url, "--model", "sim-reasoner",
                     "--db", str(tmp_path / "x.db"), "--name", "late", "--quiet",
                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("run 'late' completed"):
            for _ in range(3):  # a double (or triple) press
                proc.send_signal(signal.SIGINT)
                time.sleep(0.005)
            break
    _, rest = proc.communicate(timeout=30)
    assert seen and seen[-1].startswith("run 'late' completed"), "".join(seen) + rest
    # the run's last words carry its final counts, not a snapshot taken before the last records were written
    # (said once: the counts, then why it ended, #37)
    assert seen[-1] == "run 'late' completed: 20 ok, 0 errors, 0 timeouts, 0 pending — all prompts processed\n", seen[-1]
    assert proc.returncode == 0, "".join(seen) + rest
