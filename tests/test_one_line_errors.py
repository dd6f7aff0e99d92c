"""One line and exit code 2 for every mistake, found before anything is written (#37): a flag out of range without
the usage above it, no database left by a refused dataset or a busy port, no lock file beside a database; and
`--version`, help on every flag."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from synthwatch.cli import build_parser


def _one_line(proc: Any, command: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # not the command's usage (28 lines for run) above it
    assert lines[0].startswith(f"synthwatch {command}: error: ".replace(" :", ":")), lines[0]
    return str(lines[0])


@pytest.mark.parametrize(("flag", "value", "says"), [("--concurrency", "0", "must be at least 1, got 0"),
                                                     ("--cap", "-1", "must be at least 1, got -1"),
                                                     ("--concurrency", "many", "expected a whole number")])
def test_a_flag_out_of_range_is_one_line(flag: str, value: str, says: str, tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    proc = run_cli("run", "--dataset", str(tmp_path / "p.jsonl"), "--base-url", "http://127.0.0.1:9/v1", "--model",
                   "m", "--db", str(db), flag, value)
    assert says in _one_line(proc, "run")
    assert not db.exists()


def test_an_unknown_command_or_flag_is_one_line() -> None:
    proc = run_cli("nope")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("synthwatch: error: argument COMMAND: invalid choice: 'nope'"), proc.stderr
    proc = run_cli("serve", "--no-such-flag")
    assert "unrecognized arguments: --no-such-flag" in _one_line(proc, "")[len("synthwatch"):]


def test_version() -> None:
    from importlib.metadata import version

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"synthwatch {version('synthwatch')}", proc.stdout


def test_a_dataset_whose_rows_are_all_bad_leaves_no_database(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": 1}\n{"messages": 5}\n', encoding="utf-8")
    db = tmp_path / "new.db"
    proc = run_cli("run", "--dataset", str(data), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--db", str(db), "--no-preflight")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_serve_on_a_busy_port_leaves_no_database(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = run_cli("serve", "--db", str(tmp_path / "s.db"), "--port", str(port))
    assert f"cannot listen on 127.0.0.1:{port}" in _one_line(proc, "serve")
    assert list(tmp_path.iterdir()) == []


def test_no_lock_file_is_left_beside_a_database(tmp_path: Path) -> None:
    proc = run_cli("db", "upgrade", "--db", str(tmp_path / "a.db"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db"]


def _parsers(parser: argparse.ArgumentParser, name: str = "synthwatch") -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                out += _parsers(sub, f"{name} {sub_name}")
    return out


def test_every_flag_of_every_command_has_help() -> None:
    missing = []
    for name, parser in _parsers(build_parser()):
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue  # positionals are named in the usage; old flag names are hidden on purpose
            if not (action.help or "").strip():
                missing.append(f"{name} {'/'.join(action.option_strings)}")
    assert not missing, "flags without help: " + ", ".join(missing)


def test_an_unknown_toml_key_names_the_nearest_key(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('model = "m"\nconcurency = 4\n[dataset]\npath = "x.jsonl"\n[sampling]\ntemprature = 0.5\n'
                   '[[endpoints]]\nbase_url = "http://127.0.0.1:9/v1"\napi_key_envv = "K"\n[checks]\nno_such = 1\n'
                   '[checks.rules.empty_reasoning]\nthresold = 0.1\n',
                   encoding="utf-8")
    proc = run_cli("run", "--config", str(cfg), "--db", str(tmp_path / "x.db"))
    assert proc.returncode == 2, proc.stderr
    assert "concurency: unknown key (did you mean concurrency?)" in proc.stderr
    assert "sampling.temprature: unknown key (did you mean temperature?)" in proc.stderr
    assert "endpoints.0.api_key_envv: unknown key (did you mean api_key_env?)" in proc.stderr
    assert "checks.no_such: unknown key\n" in proc.stderr + "\n"  # nothing near it: no guess
    assert "checks.rules.empty_reasoning.thresold: unknown key (did you mean threshold or pause_threshold?)" \
        in proc.stderr
    assert not (tmp_path / "x.db").exists()
