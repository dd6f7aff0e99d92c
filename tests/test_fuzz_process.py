"""Property-based, through the real process: ``synthwatch run`` answers SIGTERM whatever a server sends (#25 item 7).

Each example serves one :class:`tests.fuzzkit.Wire` to every request of a 200-record run started as a process of its
own (``synthwatch run``, concurrency 4). Once the server has seen the first request, the test sends SIGTERM and
asserts:

- the process exits within the stop deadline plus 5 s (the deadline: the run's ``shutdown_grace_s`` where the
  worker has one, else the documented behaviour before #25 item 5: a graceful stop lets in-flight requests run to
  their total timeout, here 4 s), with the code of a stopped (3) or completed (0) run and no traceback;
- its peak resident memory (VmHWM, read before the signal) stays under 400 MB;
- no record is left ``in_flight``; every stored row reads back (UTF-8 text, JSON columns parse); the dashboard
  (a real server on a real port) serves the run's pages and JSON; ``synthwatch export --format raw`` either writes
  lines that parse or refuses with a one-line message, never a traceback.

The replay of tests/fuzz_regressions/process-*.json runs each saved example the same way.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, LiveServer, cli_env, run_cli
from hypothesis import given, settings

from synthwatch.config import RunConfig
from tests.fuzzchecks import check_readers, check_stored
from tests.fuzzkit import (
    PHASES,
    Wire,
    examples,
    load_regression,
    regression_files,
    save_regression,
    serve,
    spend,
    wires,
)
from tests.hostileserver import HostileServer

SUITE = "process"
TOTAL_S = 4
PEAK_RSS_MB = 400
_names = itertools.count()
# #25 item 5 (branch `shutdown`) adds a stop deadline; until then a graceful stop waits for the total timeout
GRACE_S = 3.0 if "shutdown_grace_s" in RunConfig.model_fields else None


class Rig:
    def __init__(self, tmp: Path) -> None:
        from synthwatch.app.main import create_app
        from synthwatch.settings import Settings
        from synthwatch.store.db import open_engine

        self.tmp = tmp
        self.db = tmp / "fuzz.db"
        self.engine = open_engine(str(self.db))
        self.dashboard = LiveServer(create_app(str(self.db), Settings(db=str(self.db)))).start()
        self.dataset = tmp / "prompts.jsonl"
        self.dataset.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"HOSTILE {i}"}]}) + "\n"
                                        for i in range(200)))

    def close(self) -> None:
        self.dashboard.stop()
        self.engine.dispose()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    r = Rig(tmp_path_factory.mktemp("fuzz-process"))
    yield r
    r.close()


def _peak_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_one(rig: Rig, wire: Wire) -> None:
    name = f"proc-{next(_names)}"
    with HostileServer(serve(wire)) as srv:
        grace = f"shutdown_grace_s = {GRACE_S}\n" if GRACE_S is not None else ""
        total_s = 60 if GRACE_S is not None else TOTAL_S  # with a deadline, the deadline is what ends a stop
        cfg = rig.tmp / f"{name}.toml"
        cfg.write_text(
            f'name = "{name}"\nmodel = "sim-reasoner"\nconcurrency = 4\nstream = {str(wire.stream).lower()}\n'
            f'dataset = {{ path = "{rig.dataset}" }}\nendpoints = [{{ base_url = "{srv.url}" }}]\n'
            f'timeouts = {{ connect_s = 2, total_s = {total_s}, idle_s = 2 }}\nretries = {{ max_attempts = 1 }}\n'
            f'limits = {{ max_body_bytes = 4194304, max_event_bytes = 1048576 }}\n{grace}')
        proc = subprocess.Popen([sys.executable, "-m", "synthwatch", "run", "--config", str(cfg), "--db", str(rig.db),
                                 "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=cli_env(), cwd=ROOT)
        try:
            assert srv.hostile_seen.wait(60), "the worker never sent a request"
            peak = _peak_rss_mb(proc.pid)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            bound = (GRACE_S if GRACE_S is not None else TOTAL_S) + 5
            try:
                out, err = proc.communicate(timeout=bound)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                raise AssertionError(f"still running {bound} s after SIGTERM:\n{err[-3000:]}") from None
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode in (0, 3), (proc.returncode, err[-3000:])
    for bad in ("Traceback", "writer crashed", "worker failed"):
        assert bad not in err, err[-3000:]
    assert peak < PEAK_RSS_MB, f"peak resident memory {peak:.0f} MB"
    with rig.engine.connect() as conn:
        from sqlalchemy import text

        run_id = conn.execute(text("SELECT id FROM run WHERE name = :n"), {"n": name}).scalar_one()
    check_stored(rig.db, run_id, stopped=True)
    check_readers(rig.dashboard.url, rig.engine, run_id, rig.tmp)
    export = run_cli("export", "--db", str(rig.db), "--format", "raw", "--out", str(rig.tmp / f"{name}.jsonl"),
                     "--no-default-exclusions", "--allow-open-alarms", "--quiet", name, timeout=120)
    assert "Traceback" not in export.stderr, export.stderr[-3000:]
    if export.returncode == 0:
        for line in (rig.tmp / f"{name}.jsonl").read_bytes().splitlines():
            json.loads(line)
    else:
        assert export.stderr.strip(), "a refused export says why"
    assert took < bound


# Over 30 s (~35 s here): 4 generated replies, each against a real `synthwatch run` process signalled mid-request
# and waited on for its grace period; process start-up and the grace are the time.
@pytest.mark.slow
@settings(max_examples=examples(ci=4), phases=PHASES)
@given(wire=wires())
def test_sigterm_is_answered_whatever_the_server_sends(rig: Rig, wire: Wire) -> None:
    spend(SUITE)
    try:
        run_one(rig, wire)
    except BaseException as exc:
        save_regression(SUITE, {"wire": wire}, exc)
        raise


if regression_files(SUITE):  # the replay exists once ./dev fuzz has saved a case (no quiet empty-set skip)

    @pytest.mark.slow
    @pytest.mark.parametrize("path", regression_files(SUITE), ids=lambda p: p.stem)
    def test_regression(rig: Rig, path: Path, request: pytest.FixtureRequest) -> None:
        run_one(rig, **load_regression(path, request))
