"""The first hour of a new user (#27): every command a newcomer types does what the README says, and every mistake
is one clear line with a documented exit code, found before anything is written."""

from __future__ import annotations

import http.server
import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HTTP_TIMEOUT_S, cli_env, popen_cli, run_cli, wait_http_ready
from workerkit import wait_for

from synthwatch.cli import COMMANDS
from synthwatch.hints import program
from synthwatch.store.db import open_engine


def _runs(db: Path) -> list[tuple[int, str, str]]:
    from sqlalchemy import text

    engine = open_engine(str(db))
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text("SELECT id, name, status FROM run ORDER BY id"))]  # type: ignore[misc]
    finally:
        engine.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_error_line(proc: subprocess.CompletedProcess[str], command: str) -> str:
    """The command's error: exactly one `synthwatch COMMAND: error:` line and no traceback."""
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"synthwatch {command}: error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ------------------------------------------------------------------------------------ the same command resumes


@pytest.mark.slow  # two or more CLI processes (> 5 s here)
def test_the_same_run_command_twice_resumes_one_run(tmp_path: Path, sim: Any, prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_tokens="5", content_tokens="5")
    db = tmp_path / "s.db"
    cmd = ("run", "--dataset", str(prompts(4)), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
           "--quiet")
    first = run_cli(*cmd)
    assert first.returncode == 0, first.stderr
    m = re.search(r"starting run '(prompts-sim-reasoner-[0-9a-f]{6})' \(id 1\)", first.stderr)
    assert m, first.stderr
    second = run_cli(*cmd)
    assert second.returncode == 0, second.stderr
    assert f"resuming run '{m.group(1)}' (id 1)" in second.stderr
    assert [(i, n) for i, n, _ in _runs(db)] == [(1, m.group(1))]


@pytest.mark.slow  # two or more CLI processes (> 5 s here)
def test_a_run_of_the_same_dataset_under_another_name_is_named_not_duplicated(tmp_path: Path, sim: Any,
                                                                             prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_tokens="5", content_tokens="5")
    db = tmp_path / "s.db"
    data = prompts(2)
    old = run_cli("run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
                  "--name", "older", "--quiet")
    assert old.returncode == 0, old.stderr
    proc = run_cli("run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", str(db))
    assert proc.returncode == 2
    line = _one_error_line(proc, "run")
    assert "resume run 'older'? use --name older" in line, line
    assert [n for _, n, _ in _runs(db)] == ["older"]


# ------------------------------------------------------------------------------------------------- preflight


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"error": "invalid api key: sk-***"}'
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def refusing_server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("case", ["missing_v1", "wrong_model", "dead", "auth", "refused_key"])
def test_run_checks_the_endpoint_before_creating_anything(case: str, tmp_path: Path, sim: Any, prompts: Any,
                                                         refusing_server: str) -> None:
    url = sim(seed=1)
    base, model, expect = {
        "missing_v1": (url.removesuffix("/v1"), "sim-reasoner",
                       f"the base URL misses /v1; use --base-url {url} (base_url = \"{url}\")"),
        "wrong_model": (url, "kimi-k2.5", "does not serve model 'kimi-k2.5'; it serves: sim-reasoner; use --model "
                        "sim-reasoner (model = \"sim-reasoner\")"),
        "dead": ("http://127.0.0.1:9/v1", "m", "cannot reach http://127.0.0.1:9/v1"),
        "auth": (refusing_server, "m", "answered 401 '{\"error\": \"invalid api key: sk-***\"}': the server wants an "
                 "API key it accepts; put it in an environment variable and name it with --api-key-env NAME"),
        # a key was given, in the variable --api-key-env names, and refused: that is what the line says (#37)
        "refused_key": (refusing_server, "m", "the server refused the key in $MY_KEY; check that the variable holds "
                        "a key this server accepts"),
    }[case]
    db = tmp_path / "pre.db"
    key = ["--api-key-env", "MY_KEY"] if case == "refused_key" else []
    proc = run_cli("run", "--dataset", str(prompts(3)), "--base-url", base, "--model", model, "--db", str(db), *key,
                   env=cli_env(MY_KEY="sk-not-accepted-0123456789"))
    assert proc.returncode == 2
    line = _one_error_line(proc, "run")
    assert line.startswith("synthwatch run: error: preflight: ") and expect in line, line
    assert "starting run" not in proc.stderr and not db.exists()


def test_probe_names_a_missing_v1_and_the_served_models(sim: Any) -> None:
    url = sim(seed=1)
    proc = run_cli("probe", "--base-url", url.removesuffix("/v1"), "--model", "sim-reasoner", "--timeout", "30")
    assert proc.returncode == 2 and "the base URL misses /v1" in _one_error_line(proc, "probe")
    proc = run_cli("probe", "--base-url", url, "--model", "nope", "--timeout", "30")
    assert proc.returncode == 2 and "it serves: sim-reasoner; use --model sim-reasoner" in _one_error_line(proc, "probe")


@pytest.mark.slow  # two or more CLI processes (> 5 s here)
def test_probe_recommends_each_setting_as_flag_and_toml_key(sim: Any) -> None:
    url = sim(seed=1, token_ids="deepseek")
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner", "--timeout", "60")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    settings = next(ln for ln in proc.stdout.splitlines() if ln.startswith("settings:"))
    assert "--request-token-ids (request_token_ids = true)" in settings, settings
    assert '--reasoning-mode reasoning ([reasoning] mode = "reasoning")' in settings, settings
    run_with = next(ln for ln in proc.stdout.splitlines() if ln.startswith("run with:"))
    assert f"{program()} run --base-url {url} --model sim-reasoner" in run_with
    assert "--request-token-ids" in run_with and "--reasoning-mode reasoning" in run_with


@pytest.mark.slow  # two or more CLI processes (> 5 s here)
def test_old_flag_name_still_works(tmp_path: Path, sim: Any, prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_tokens="5", content_tokens="5", token_ids="deepseek")
    db = tmp_path / "t.db"
    proc = run_cli("run", "--dataset", str(prompts(2)), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
                   "--return-token-ids", "--quiet")
    assert proc.returncode == 0, proc.stderr
    engine = open_engine(str(db))
    from synthwatch.store.queue import run_row

    with engine.connect() as conn:
        assert json.loads(run_row(conn, 1)["config_json"])["request_token_ids"] is True
    engine.dispose()


def test_a_flag_error_names_its_toml_key_and_the_key_named_flag_exists(tmp_path: Path) -> None:
    """Every error that names a flag also names the TOML key, as a key's error names its flag (with_flags); the
    flag named after the key (--prefilled-open for reasoning.prefilled_open) is accepted too."""
    proc = run_cli("run", "--dataset", str(tmp_path / "none.jsonl"), "--base-url", "http://127.0.0.1:9/v1",
                   "--model", "m", "--db", str(tmp_path / "x.db"), "--cap", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "argument --cap (cap in a TOML file): must be at least 1" in proc.stderr, proc.stderr
    proc = run_cli("run", "--dataset", str(tmp_path / "none.jsonl"), "--base-url", "http://127.0.0.1:9/v1",
                   "--model", "m", "--db", str(tmp_path / "x.db"), "--max-tokens", "many")
    assert "argument --max-tokens (sampling.max_tokens in a TOML file):" in proc.stderr, proc.stderr
    proc = run_cli("run", "--dataset", str(tmp_path / "none.jsonl"), "--base-url", "http://127.0.0.1:9/v1",
                   "--model", "m", "--db", str(tmp_path / "x.db"), "--prefilled-open")
    assert proc.returncode == 2 and "no such file" in proc.stderr, proc.stderr  # the flag parsed; the file is next


# ------------------------------------------------------------------------- configuration problems come first


def test_toml_with_unset_key_variable_fails_before_starting(tmp_path: Path, sim: Any, prompts: Any) -> None:
    url = sim(seed=1)
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'name = "toml-run"\nmodel = "sim-reasoner"\n[dataset]\npath = "{prompts(2)}"\n'
                   f'[[endpoints]]\nbase_url = "{url}"\napi_key_env = "SW_FIRST_HOUR_UNSET"\n')
    db = tmp_path / "k.db"
    proc = run_cli("run", "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2
    line = _one_error_line(proc, "run")
    assert "environment variable SW_FIRST_HOUR_UNSET is not set" in line
    assert "--api-key-env NAME, or api_key_env under [[endpoints]]" in line
    assert "starting run" not in proc.stderr and not db.exists()


@pytest.mark.parametrize("case", ["bad_toml", "missing_dataset", "bad_settings"])
def test_config_problems_are_reported_before_the_database_is_written(case: str, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    if case == "bad_toml":
        cfg = tmp_path / "broken.toml"
        cfg.write_text("model = \n")
        args: tuple[str, ...] = ("--config", str(cfg))
        expect = "broken.toml: not valid TOML"
    elif case == "bad_settings":  # each key its flag too
        cfg = tmp_path / "bad.toml"
        cfg.write_text('model = "m"\ncap = -1\n[dataset]\npath = "p.jsonl"\nlimit = 0\n[[endpoints]]\n'
                       'base_url = "ftp://x"\n')
        args = ("--config", str(cfg))
        expect = "bad.toml + command line)"
        proc = run_cli("run", *args, "--db", str(db))
        assert proc.returncode == 2 and not db.exists()
        for line in ("  dataset.limit: Input should be greater than or equal to 1 (--limit)",
                     "  endpoints.0.base_url: not an http(s) URL: 'ftp://x' (expected e.g. http://127.0.0.1:8000/v1) "
                     "(--base-url)", "  cap: Input should be greater than or equal to 1 (--cap)"):
            assert line in proc.stderr.splitlines(), proc.stderr
    else:
        args = ("--dataset", str(tmp_path / "nope.jsonl"), "--base-url", "http://127.0.0.1:9/v1", "--model", "m")
        expect = "nope.jsonl: no such file or directory (--dataset, or path under [dataset] in --config)"
    proc = run_cli("run", *args, "--db", str(db))
    assert proc.returncode == 2 and expect in _one_error_line(proc, "run")
    assert not db.exists()


# -------------------------------------------------------------------------------------------------- messages


def test_dataset_messages_name_the_flag_and_say_at_once(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "fine"}]}\n'
                    '{"messages": [{"role": "user", "content": "tab\there"}]}\n')
    proc = run_cli("run", "--dataset", str(data), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--db", str(tmp_path / "x.db"), "--no-preflight")
    assert proc.returncode == 2
    assert "Invalid control character at column" in proc.stderr and "at at" not in proc.stderr, proc.stderr
    assert "add --skip-bad-lines, or on_bad_line = \"skip\" under [dataset]" in proc.stderr


@pytest.mark.slow  # two or more CLI processes (> 5 s here)
def test_export_without_token_ids_names_the_run_flag(tmp_path: Path, sim: Any, prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_tokens="5", content_tokens="5")
    db = tmp_path / "e.db"
    assert run_cli("run", "--dataset", str(prompts(2)), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
                   "--name", "plain", "--quiet").returncode == 0
    proc = run_cli("export", "plain", "--db", str(db), "--for", "speculators", "--out", str(tmp_path / "o.jsonl"))
    assert proc.returncode == 2
    assert f"`{program()} run --request-token-ids` (request_token_ids = true)" in _one_error_line(proc, "export")


# ------------------------------------------------------------------------------------------ the dashboard link


# ~30 s on a loaded machine, ~8 s idle: three CLI processes (two runs and a dashboard) are what is under test; the
# cases that need no new process (a stopped dashboard, SYNTHWATCH_DASHBOARD_URL) are checked in-process
@pytest.mark.slow
def test_links_use_the_dashboards_real_address(tmp_path: Path, sim: Any, prompts: Any, monkeypatch: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_tokens="5", content_tokens="5")
    db = tmp_path / "d.db"
    cmd = ("run", "--dataset", str(prompts(2)), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
           "--name", "linked", "--quiet")
    none = run_cli(*cmd)
    assert none.returncode == 0, none.stderr
    assert f"dashboard: none running; start one with `{program()} serve --db {db}`, then open its /runs/1" \
        in none.stderr
    assert ":8000" not in none.stderr
    port = _free_port()
    serve = popen_cli("serve", "--db", str(db), "--port", str(port))
    try:
        wait_http_ready(f"http://127.0.0.1:{port}", serve)
        found = run_cli(*cmd)
        assert f"dashboard: http://127.0.0.1:{port}/runs/1" in found.stderr, found.stderr
    finally:
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=60) == 0
    # the rest in-process (the same function prints the CLI's line): a stopped dashboard removed its address, and
    # SYNTHWATCH_DASHBOARD_URL wins over the database
    from synthwatch.settings import get_settings
    from synthwatch.store.dashboards import run_link

    engine = open_engine(str(db))
    try:
        assert run_link(engine, 1, "synthwatch serve").startswith("dashboard: none running")
        monkeypatch.setenv("SYNTHWATCH_DASHBOARD_URL", "https://dash.example/sw/")
        get_settings.cache_clear()
        assert run_link(engine, 1, "synthwatch serve") == "dashboard: https://dash.example/sw/runs/1"
    finally:
        get_settings.cache_clear()
        engine.dispose()


# ------------------------------------------------------------------------------------------------ a paused run


@pytest.mark.slow
def test_exit_on_pause_exits_4_and_leaves_the_run_paused(tmp_path: Path, sim: Any, prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_field="reasoning", reasoning_tokens="5", content_tokens="5")
    db = tmp_path / "p.db"
    proc = run_cli("run", "--dataset", str(prompts(300)), "--base-url", url, "--model", "sim-reasoner", "--db",
                   str(db), "--name", "story", "--reasoning-mode", "reasoning_content", "--concurrency", "4",
                   "--exit-on-pause", timeout=180)
    assert proc.returncode == 4, proc.stderr
    paused = [ln for ln in proc.stderr.splitlines() if ln.startswith("story PAUSED")]
    assert len(paused) == 1, proc.stderr  # not a TTY: one plain line, not one a second
    # the alarm holds the run (a plain resume is refused): the line names it and how to go on
    assert paused[0].startswith("story PAUSED (alarm #1 field_mismatch: Reasoning is in a field this run does not "
                                "read"), paused[0]
    sw = program()  # `synthwatch` when PATH finds this installation, else its path (tests/test_hints.py)
    assert (f"resume from another terminal: fix the cause, or acknowledge and go on: {sw} control story resume --ack "
            f"--for-records 100 --db {db}") in paused[0]
    assert "dashboard: none running; start one with" in paused[0]
    assert _runs(db)[0][2] == "paused"
    assert proc.stderr.rstrip().endswith(f"acknowledge and resume with `{sw} control story resume --ack "
                                         f"--for-records 100 --db {db}`, then run again (`{sw} run --name story "
                                         f"--db {db}`)")


# ~60 s on a loaded machine: a run and four commands from "another terminal" (fix, two rederives, resume), each
# a process of its own as a user types them; the run itself is 300 short prompts with no decode delay
@pytest.mark.slow
def test_status_line_follows_fix_and_rederive_from_another_terminal(tmp_path: Path, sim: Any,
                                                                   prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_field="reasoning", reasoning_tokens="5", content_tokens="5")
    db = tmp_path / "p.db"
    proc = popen_cli("run", "--dataset", str(prompts(300)), "--base-url", url, "--model", "sim-reasoner", "--db",
                     str(db), "--name", "story", "--reasoning-mode", "reasoning_content", "--concurrency", "4",
                     "--log-json")
    lines: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        for ln in proc.stdout:
            if ln.startswith("{"):
                lines.append(json.loads(ln))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: any(x["state"] == "paused" and x["empty_reasoning_share"] > 0.5 for x in lines), 120,
                 what="the run paused with empty reasoning")
        assert "synthwatch control story" in next(x for x in lines if x["state"] == "paused")["pause"]
        for step in (("fix", "story", "--reasoning-mode", "reasoning", "--reason", "renamed"),
                     ("rederive", "story", "--check", "field_mismatch"), ("rederive", "story", "--check",
                                                                         "empty_reasoning")):
            done = run_cli(*step, "--db", str(db), timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
        seen = len(lines)
        wait_for(lambda: any(x["empty_reasoning_share"] == 0.0 for x in lines[seen:]), 60,
                 what="the status line to show the repaired rate")
        assert run_cli("control", "story", "resume", "--db", str(db)).returncode == 0
        assert proc.wait(timeout=180) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------ every command: busy port, missing file, dead endpoint


def _busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, int(s.getsockname()[1])


COMMAND_CASES = {
    # command module -> [(case, argv, expected exit code, part of the one line)]
    "run": [("missing file", ["run", "--dataset", "{tmp}/missing.jsonl", "--base-url", "http://127.0.0.1:9/v1",
                              "--model", "m", "--db", "{db}"], 2, "no such file or directory"),
            ("dead endpoint", ["run", "--dataset", "{prompts}", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                               "--db", "{db}"], 2, "cannot reach http://127.0.0.1:9/v1")],
    "simulate": [("busy port", ["simulate", "--port", "{busy}"], 2, "cannot listen on 127.0.0.1:{busy}")],
    "serve": [("busy port", ["serve", "--db", "{db}", "--port", "{busy}"], 2, "cannot listen on 127.0.0.1:{busy}")],
    "demo": [],  # a busy port: the demo takes a free one (test_demo); its stop line: test_demo_stops_with_a_line
    "export": [("missing file", ["export", "r", "--db", "{tmp}/missing.db", "--out", "{tmp}/o.jsonl"], 2,
                "no database at")],
    "probe": [("dead endpoint", ["probe", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"], 2,
               "cannot reach http://127.0.0.1:9/v1")],
    "watch": [("missing file", ["import", "{tmp}/missing.jsonl", "--db", "{db}"], 2, "missing.jsonl")],
    "control": [("missing run", ["control", "nope", "pause", "--db", "{db}"], 2, "no run 'nope'")],
    "checks": [("missing file", ["checks", "nope", "--db", "{db}", "--config", "{tmp}/missing.toml"], 2, "")],
    "repair": [("missing run", ["rederive", "nope", "--check", "field_mismatch", "--db", "{db}"], 2, "no run 'nope'")],
    "judge": [("missing run", ["judge", "nope", "--db", "{db}", "--config", "{tmp}/missing.toml"], 2,
               "no run 'nope'")],
    "streams": [("missing run", ["watch-streams", "nope", "--db", "{db}", "--once"], 2, "no run 'nope'")],
    "db": [("dead endpoint", ["db", "upgrade", "--db", "postgresql://u@127.0.0.1:9/x"], 2,
            "cannot open or migrate database postgresql+psycopg://u@127.0.0.1:9/x")],
}


def test_every_command_has_its_cases() -> None:
    assert {m.rsplit(".", 1)[1] for m in COMMANDS} == set(COMMAND_CASES)


@pytest.mark.parametrize(("module", "case", "argv", "code", "expect"),
                         [(m, *c) for m, cases in COMMAND_CASES.items() for c in cases],
                         ids=[f"{m}-{c[0]}" for m, cases in COMMAND_CASES.items() for c in cases])
def test_each_command_fails_with_one_line(module: str, case: str, argv: list[str], code: int, expect: str,
                                          tmp_path: Path, prompts: Any) -> None:
    busy, port = _busy_port()
    with busy:
        fill = {"tmp": str(tmp_path), "db": str(tmp_path / "x.db"), "prompts": str(prompts(2)), "busy": str(port)}
        args = [a.format(**fill) for a in argv]
        proc = run_cli(*args, timeout=120)
    assert proc.returncode == code, proc.stdout + proc.stderr
    line = _one_error_line(proc, args[0])
    assert expect.format(**fill) in line, line


@pytest.mark.parametrize("command", ["simulate", "serve"])
def test_ctrl_c_stops_a_server_command_with_exit_0(command: str, tmp_path: Path) -> None:
    port = _free_port()
    args = ["simulate", "--port", str(port)] if command == "simulate" else [
        "serve", "--db", str(tmp_path / "x.db"), "--port", str(port)]
    proc = popen_cli(*args)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}", proc, path="/v1/models" if command == "simulate" else "/healthz")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HTTP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err


def test_runs_list_timeout_badge_labels_whole_run_and_recent_shares() -> None:
    from synthwatch.app.stats import run_badges

    whole = {"n_timeout": 1, "n_error": 0, "timeout_share": 1 / 200, "recent_timeout_share": 0.0}
    assert run_badges(whole) == [("warn", "1 timeout (0.5% of the run; 0.0% in the last 60 s)")]
    ended = {"n_timeout": 3, "n_error": 0, "timeout_share": 0.03, "recent_timeout_share": None}
    assert run_badges(ended) == [("warn", "3 timeouts (3.0% of the run)")]


def test_alarm_links_use_the_running_dashboard_and_skip_a_dead_ones_row(tmp_path: Path, monkeypatch: Any) -> None:
    from sqlalchemy import text

    from synthwatch.quality.detection.alarms import AlarmKeeper
    from synthwatch.settings import get_settings
    from synthwatch.store.dashboards import dashboard_url, forget_dashboard, record_dashboard

    monkeypatch.delenv("SYNTHWATCH_DASHBOARD_URL", raising=False)
    get_settings.cache_clear()
    engine = open_engine(str(tmp_path / "a.db"))
    try:
        assert dashboard_url(engine) is None
        row = record_dashboard(engine, "http://127.0.0.1:8080/")
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        with engine.begin() as conn:  # a newer row from a dashboard that was killed: its process is gone
            conn.execute(text("INSERT INTO dashboard (url, host, pid, started_at) VALUES "
                              "('http://127.0.0.1:9999', :h, :p, 1e12)"), {"h": socket.gethostname(), "p": gone.pid})
        assert dashboard_url(engine) == "http://127.0.0.1:8080"
        keeper = AlarmKeeper(1, "r")
        with engine.connect() as conn:
            keeper.load(conn)
        assert keeper.found_url == "http://127.0.0.1:8080"
        configured = AlarmKeeper(1, "r", dashboard_url="https://dash.example")
        with engine.connect() as conn:
            configured.load(conn)
        assert configured.found_url == ""  # a configured base wins
        forget_dashboard(engine, row)
        assert dashboard_url(engine) is None
        monkeypatch.setenv("SYNTHWATCH_DASHBOARD_URL", "https://proxy.example/sw/")
        get_settings.cache_clear()
        assert dashboard_url(engine) == "https://proxy.example/sw"
    finally:
        get_settings.cache_clear()
        engine.dispose()


@pytest.mark.slow
def test_on_a_terminal_the_progress_line_is_rewritten_in_place_and_the_pause_said_once(
        tmp_path: Path, sim: Any, prompts: Any) -> None:
    import os
    import pty

    url = sim(seed=1, tokens_per_s=0, reasoning_field="reasoning", reasoning_tokens="5", content_tokens="5")
    db = tmp_path / "t.db"
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "synthwatch", "run", "--dataset", str(prompts(300)), "--base-url",
                             url, "--model", "sim-reasoner", "--db", str(db), "--name", "tty", "--reasoning-mode",
                             "reasoning_content", "--concurrency", "4", "--exit-on-pause"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, env=cli_env())
    os.close(slave)
    got = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    assert proc.wait(timeout=180) == 4
    out = got.decode("utf-8", "replace")
    assert "\r\x1b[2Ktty [running] ok " in out, out
    assert out.count("tty PAUSED (") == 1, out
    assert "\r\x1b[2Ktty PAUSED (" in out, out
    # an alarm holds the run: the way on is to fix the cause or to acknowledge it (a plain resume is refused)
    # (the first word is whatever a new shell finds: synthwatch.hints.program() in the worker's own environment)
    assert re.search(r"resume from another terminal: fix the cause, or acknowledge and go on: \S*synthwatch "
                     r"control tty resume --ack --for-records \d+", out), out


def test_ctrl_c_ends_watch_with_exit_0_and_says_where_it_stopped(tmp_path: Path) -> None:
    follow = tmp_path / "out.jsonl"
    follow.write_text("")
    proc = popen_cli("watch", str(follow), "--db", str(tmp_path / "w.db"))
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith(f"watching {follow} into run 'out'"), first
        with follow.open("a") as fh:  # ready once it has read a line (its signal handlers are in place by then)
            fh.write(json.dumps({"question": "What is 1 + 1?", "reasoning": "add", "content": "2",
                                 "finish_reason": "stop"}) + "\n")
        while "recognised:" not in (line := proc.stderr.readline()) or "nothing yet" in line:
            assert line, "watch ended before it read the line"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HTTP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert f"watch of {follow} ended (signal) at line 1" in err and "Traceback" not in out + err
