"""README.md followed literally (#27): its commands are parsed from the README itself, so that the two cannot drift
apart, and typed against the simulator. Only what stands for the user's own things is replaced: their server's
URL (the simulator's), their model name (the simulator's), the dashboard's port (a free one), and RUN (the name
`run` printed, as the README says)."""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import HTTP_TIMEOUT_S, ROOT, cli_env, wait_http_ready, write_prompts

README = ROOT / "README.md"


def section_commands(heading: str) -> list[str]:
    """The shell commands of the first ```bash block under ``heading``, continuation lines joined."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert block, f"no bash block under {heading!r}"
    joined = block.group(1).replace("\\\n", " ")
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_readme_has_the_commands_this_test_follows() -> None:
    own = section_commands("## Using it on your own endpoint")
    assert [shlex.split(c, comments=True)[1] for c in own] == ["serve", "probe", "run", "export"], own
    assert any(c.startswith("./dev demo") for c in section_commands("## Quick start"))


@pytest.mark.slow
def test_using_it_on_your_own_endpoint_as_written(tmp_path: Path, sim: Any) -> None:
    """serve → probe → run → the same run command again (one run, resumed) → export for speculators → rows."""
    url = sim(seed=4, tokens_per_s=0, reasoning_tokens="8-20", content_tokens="5-15", token_ids="deepseek")
    write_prompts(tmp_path / "prompts.jsonl", 12)  # the README's dataset file name, in the working folder
    port = _free_port()
    env = cli_env()
    run_name: list[str] = []

    def argv(command: str) -> tuple[list[str], bool]:
        words = shlex.split(command, comments=True)
        background = words[-1] == "&"
        words = [w for w in words if w != "&"]
        assert words[0] == ".venv/bin/synthwatch", command
        out = []
        for w in words[1:]:
            w = w.replace("http://127.0.0.1:8000/v1", url).replace("kimi-k2.5", "sim-reasoner")
            if w == "8080":
                w = str(port)
            if w == "RUN":
                w = run_name[0]
            out.append(w)
        return [sys.executable, "-m", "synthwatch", *out], background

    def typed(command: str) -> subprocess.CompletedProcess[str]:
        args, _ = argv(command)
        return subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)

    serve_cmd, probe_cmd, run_cmd, export_cmd = section_commands("## Using it on your own endpoint")
    args, background = argv(serve_cmd)
    assert background
    serve = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}", serve)

        probe = typed(probe_cmd)
        assert probe.returncode == 0, probe.stdout + probe.stderr
        run_with = next(ln for ln in probe.stdout.splitlines() if ln.startswith("run with:"))
        # what the probe recommends as flags, the README's run command has (the reasoning mode: auto finds it)
        recommended = [f for f in re.findall(r" (--[a-z-]+)", run_with) if f not in ("--base-url", "--model",
                                                                                       "--dataset",
                                                                                       "--reasoning-mode")]
        assert recommended and all(f in run_cmd for f in recommended), (recommended, run_cmd)

        first = typed(run_cmd)
        assert first.returncode == 0, first.stderr
        m = re.search(r"starting run '(prompts-sim-reasoner-[0-9a-f]{6})' \(id (\d+)\)", first.stderr)
        assert m, first.stderr
        run_name.append(m.group(1))
        assert f"dashboard: http://127.0.0.1:{port}/runs/{m.group(2)}" in first.stderr, first.stderr

        again = typed(run_cmd)  # "Running the same command again resumes the run"
        assert again.returncode == 0, again.stderr
        assert f"resuming run '{m.group(1)}' (id {m.group(2)})" in again.stderr, again.stderr
        import httpx

        runs = httpx.get(f"http://127.0.0.1:{port}/api/runs", timeout=HTTP_TIMEOUT_S).json()["runs"]
        assert [r["name"] for r in runs] == [m.group(1)]

        export = typed(export_cmd)
        assert export.returncode == 0, export.stdout + export.stderr
        rows = [json.loads(ln) for ln in (tmp_path / "train.jsonl").read_text().splitlines()]
        assert len(rows) == 12
        assert all(r["input_ids"] and len(r["input_ids"]) == len(r["loss_mask"]) and any(r["loss_mask"])
                   for r in rows)
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()


# ~40 s on a loaded machine: `./dev demo` itself (its set-up check, two simulators, two worker processes, the
# dashboard) for 12 s, then its graceful stop; nothing of it can be left out and still be the README's command
@pytest.mark.slow
def test_quick_start_demo_as_written_ends_with_what_it_kept(tmp_path: Path) -> None:
    """`./dev demo` from the README (with a time limit, a free port and its own folder added), to its last line."""
    demo = next(c for c in section_commands("## Quick start") if c.startswith("./dev demo"))
    words = shlex.split(demo, comments=True)
    proc = subprocess.run([str(ROOT / words[0]), *words[1:], "--dir", str(tmp_path / "demo"), "--port", "0",
                           "--duration-s", "12"], capture_output=True, text=True, env=cli_env(), cwd=tmp_path,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"synthwatch demo: stopped: (\d+) records kept in (\S+) \(see them again: (\S+ serve "
                     r"--db \S+)\)", last)
    assert m and int(m.group(1)) > 0 and Path(m.group(2)) == tmp_path / "demo" / "demo.db", last
    # the hint works pasted into a new shell in the folder where it was printed (#37): its first word is found
    from test_hints import assert_filled, assert_found

    assert_found(m.group(3), tmp_path)
    assert_filled(m.group(3))
    ids = dict(re.findall(r"run (demo-\w+)-\d+: http://127\.0\.0\.1:\d+/runs/(\d+)", proc.stdout))
    assert ids == {"demo-healthy": "1", "demo-drift": "2"}, proc.stdout  # the same ids at every launch
