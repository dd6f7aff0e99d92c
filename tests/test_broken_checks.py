"""A broken check is not silent (#35): a user check that cannot be imported refuses the run, the import or the
recompute before anything is read or asked (exit 2, the check named); errored verdicts of the extended checks and
of a judge can be retried (`checks RUN --retry-errors`, `judge RUN --retry-errors`), the error kept in the history.

Real `synthwatch` processes, the simulator and a judge server on real ports, a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from conftest import HTTP_TIMEOUT_S, cli_env, run_cli
from sqlalchemy import text
from workerkit import run_row

from synthwatch.store.db import open_engine

pytestmark = pytest.mark.slow  # each runs synthwatch processes (and check processes)


def prompts(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {3 + i} + {5 + i}?"}) + "\n")
    return path


def user_module(root: Path) -> Path:
    """A module of user checks: `flaky` raises while the file FLAKY names exists, `fine` always passes."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "swtest_broken.py").write_text(textwrap.dedent('''
        import os

        NOT_A_FUNCTION = 3

        def flaky(record):
            if os.path.exists(os.environ["SWTEST_FLAKY"]):
                raise RuntimeError("the check's service is down")
            return True

        def fine(record):
            return True
    '''))
    (root / "swtest_raises_on_import.py").write_text("raise RuntimeError('no licence key')\n")
    return root


def checks_toml(path: Path, gen_url: str, data: Path, function: str, *, name: str = "broken") -> Path:
    path.write_text(textwrap.dedent(f"""
        name = "{name}"
        model = "sim-reasoner"
        concurrency = 4
        [dataset]
        path = "{data}"
        [[endpoints]]
        base_url = "{gen_url}"
        [[checks.user]]
        name = "mine"
        function = "{function}"
    """))
    return path


UNLOADABLE = [
    ("swtest_nowhere:check", "No module named 'swtest_nowhere'"),
    ("swtest_broken:missing", "has no attribute 'missing'"),
    ("swtest_broken:NOT_A_FUNCTION", "is not callable"),
    ("swtest_raises_on_import:check", "RuntimeError: no licence key"),
]


@pytest.mark.parametrize(("function", "why"), UNLOADABLE)
def test_an_unimportable_user_check_refuses_the_run_before_its_first_request(function, why, tmp_path, sim,  # type: ignore[no-untyped-def]
                                                                             db_path) -> None:
    env = cli_env(PYTHONPATH=str(user_module(tmp_path / "pkg")), SWTEST_FLAKY=str(tmp_path / "flag"))
    gen = sim(seed=1, reasoning_tokens="3-5", content_tokens="3-5")
    cfg = checks_toml(tmp_path / "run.toml", gen, prompts(tmp_path / "p.jsonl", 5), function)
    res = run_cli("run", "--config", str(cfg), "--db", str(db_path), "--quiet", env=env, timeout=120)
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("synthwatch run: error: user check 'mine'") and why in line, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    # nothing was created, nothing was asked
    engine = open_engine(str(db_path))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM run")).scalar() == 0


def test_a_resume_and_a_recompute_refuse_a_user_check_that_no_longer_imports(tmp_path, sim, db_path,  # type: ignore[no-untyped-def]
                                                                           live_app) -> None:
    """The run was made with a check that imports; the module then disappears (a new venv, another host): the
    resume, `checks --recompute/--pending/--retry-errors` and `import` into it refuse, naming the check."""
    pkg = user_module(tmp_path / "pkg")
    env = cli_env(PYTHONPATH=str(pkg), SWTEST_FLAKY=str(tmp_path / "flag"))
    gen = sim(seed=2, reasoning_tokens="3-5", content_tokens="3-5")
    data = prompts(tmp_path / "p.jsonl", 4)
    cfg = checks_toml(tmp_path / "run.toml", gen, data, "swtest_broken:fine")
    run_cli("run", "--config", str(cfg), "--db", str(db_path), "--quiet", env=env, check=True)
    (pkg / "swtest_broken.py").unlink()
    res = run_cli("run", "--name", "broken", "--db", str(db_path), "--quiet", env=env)
    assert res.returncode == 2 and "user check 'mine': cannot import swtest_broken:fine" in res.stderr, res.stderr
    for flag in ("--recompute", "--pending", "--retry-errors"):
        res = run_cli("checks", "broken", flag, "--db", str(db_path), env=env)
        assert res.returncode == 2, (flag, res.stderr)
        assert "user check 'mine': cannot import swtest_broken:fine" in res.stderr and "nothing was re-checked" in \
            res.stderr, (flag, res.stderr)
    # the dashboard's recompute (the checks page's button, the API) is refused the same way, naming the check
    srv = live_app()
    run_id = run_row(open_engine(str(db_path)), "broken")["id"]
    api = httpx.post(f"{srv.url}/api/runs/{run_id}/checks/recompute", timeout=HTTP_TIMEOUT_S)
    assert api.status_code == 409 and "user check 'mine': cannot import swtest_broken:fine" in api.json()["detail"]
    form = httpx.post(f"{srv.url}/runs/{run_id}/checks/recompute", timeout=HTTP_TIMEOUT_S,
                      headers={"Origin": srv.url})
    assert form.status_code == 409, form.text
    assert "user check &#39;mine&#39;" in form.text or "user check 'mine'" in form.text


def test_import_into_a_run_with_an_unimportable_user_check_is_refused(tmp_path, db_path) -> None:  # type: ignore[no-untyped-def]
    """An imported run's check settings are its own (`checks RUN --config`): the next import runs them, and one that
    does not import refuses the import before a line is read (it used to run without the run's settings at all)."""
    env = cli_env(PYTHONPATH=str(user_module(tmp_path / "pkg")), SWTEST_FLAKY=str(tmp_path / "flag"))
    lines = tmp_path / "out.jsonl"
    lines.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {
        "role": "assistant", "content": f"a{i}", "reasoning_content": "thinking"}]}) + "\n" for i in range(3)))
    run_cli("import", str(lines), "--run", "imp", "--db", str(db_path), env=env, check=True)
    settings = tmp_path / "checks.toml"
    settings.write_text('[[checks.user]]\nname = "mine"\nfunction = "swtest_nowhere:check"\n')
    run_cli("checks", "imp", "--config", str(settings), "--db", str(db_path), env=env, check=True)
    more = tmp_path / "more.jsonl"
    more.write_text(lines.read_text().replace("q0", "q9"))
    res = run_cli("import", str(more), "--run", "imp", "--db", str(db_path), env=env)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("synthwatch import: error: user check 'mine': cannot "
                                                          "import swtest_nowhere:check"), res.stderr
    engine = open_engine(str(db_path))
    run = run_row(engine, "imp")
    assert run["n_ok"] == 3 and run["status"] == "completed"  # nothing read, the run left as it was


def _verdict_rows(db_path: Path, check: str) -> dict[int, list[str]]:
    engine = open_engine(str(db_path))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT record_id, state FROM check_verdict WHERE check_name = :c ORDER BY id"),
                            {"c": check}).all()
    out: dict[int, list[str]] = {}
    for rid, state in rows:
        out.setdefault(rid, []).append(state)
    return out


def test_checks_retry_errors_reruns_only_the_errored_verdicts(tmp_path, sim, db_path) -> None:  # type: ignore[no-untyped-def]
    flag = tmp_path / "flag"
    flag.write_text("down")
    env = cli_env(PYTHONPATH=str(user_module(tmp_path / "pkg")), SWTEST_FLAKY=str(flag))
    gen = sim(seed=3, reasoning_tokens="3-5", content_tokens="3-5")
    data = prompts(tmp_path / "p.jsonl", 6)
    cfg = checks_toml(tmp_path / "run.toml", gen, data, "swtest_broken:flaky")
    cfg.write_text(cfg.read_text() + '[[checks.user]]\nname = "other"\nfunction = "swtest_broken:fine"\n')
    run_cli("run", "--config", str(cfg), "--db", str(db_path), "--quiet", env=env, check=True, timeout=180)
    before = _verdict_rows(db_path, "user:mine")
    assert len(before) == 6 and all(v == ["error"] for v in before.values())
    other_before = _verdict_rows(db_path, "user:other")
    flag.unlink()  # the check's service is back
    res = run_cli("checks", "broken", "--retry-errors", "--db", str(db_path), "--json", env=env, check=True)
    assert json.loads(res.stdout)["retried"]["retried"] == {"user:mine": 6}
    assert "retried errored verdicts: user:mine 6" in res.stderr
    after = _verdict_rows(db_path, "user:mine")
    assert all(v == ["error", "pass"] for v in after.values())  # history kept, the new verdict in force
    assert _verdict_rows(db_path, "user:other") == other_before  # a check without errors is not run again
    again = run_cli("checks", "broken", "--retry-errors", "--db", str(db_path), env=env, check=True)
    assert "none had an error verdict" in again.stderr
    assert _verdict_rows(db_path, "user:mine") == after


# ------------------------------------------------------------------------------------------ the judge


class JudgeServer:
    """An OpenAI-compatible judge whose reply is chosen by ``mode``: prose, bad JSON, hanging, or a verdict."""

    def __init__(self) -> None:
        self.mode = "prose"
        self.requests = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.port = 0

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        await request.read()
        if self.mode == "hang":
            await self.release.wait()  # longer than the judge's timeout: set only when the server stops
        if self.mode == "500":
            return web.Response(status=500, text="overloaded")
        content = {"prose": "The answer looks right to me, I would call it good.",
                   "badjson": '{"score": 0.9, "label": "good", "reason": ',
                   "ok": json.dumps({"score": 0.9, "label": "good", "reason": "fine"})}[self.mode]
        return web.json_response({
            "id": "j", "object": "chat.completion", "created": 1, "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.ready.set()
        self.loop.run_forever()

    def start(self) -> JudgeServer:
        self.thread.start()
        assert self.ready.wait(30)
        return self

    def stop(self) -> None:
        async def down() -> None:
            self.release.set()
            await self.runner.cleanup()
        asyncio.run_coroutine_threadsafe(down(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture
def judge_server() -> Iterator[JudgeServer]:
    srv = JudgeServer().start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("mode", ["prose", "badjson", "hang"])
def test_judge_retry_errors_judges_the_errored_records_again(mode: str, tmp_path, sim, db_path,  # type: ignore[no-untyped-def]
                                                            judge_server: Any) -> None:
    gen = sim(seed=4, reasoning_tokens="3-5", content_tokens="3-5")
    data = prompts(tmp_path / "p.jsonl", 5)
    run_cli("run", "--dataset", str(data), "--base-url", gen, "--model", "sim-reasoner", "--db", str(db_path),
            "--name", "judged", "--quiet", check=True)
    cfg = tmp_path / "judge.toml"
    cfg.write_text(textwrap.dedent(f"""
        [judge]
        model = "judge"
        guided = "none"
        max_attempts = 1
        timeout_s = 1.0
        concurrency = 5
        [judge.endpoint]
        base_url = "{judge_server.url}"
    """))
    judge_server.mode = mode
    first = run_cli("judge", "judged", "--db", str(db_path), "--config", str(cfg), check=True)
    assert "5 verdicts" in first.stdout and "0 good, 0 bad, 5 errors" in first.stdout, first.stdout
    assert all(v == ["error"] for v in _verdict_rows(db_path, "judge").values())
    plain = run_cli("judge", "judged", "--db", str(db_path), check=True)
    assert "0 verdicts" in plain.stdout  # a plain catch-up leaves the errors alone
    judge_server.mode = "ok"
    asked = judge_server.requests
    res = run_cli("judge", "judged", "--db", str(db_path), "--retry-errors", check=True)
    assert "retried 5 error verdicts; 0 still error" in res.stdout, res.stdout
    assert judge_server.requests - asked == 5  # each errored record asked once
    rows = _verdict_rows(db_path, "judge")
    assert len(rows) == 5 and all(v == ["error", "pass"] for v in rows.values())
    engine = open_engine(str(db_path))
    with engine.connect() as conn:
        n_fail, n_total = conn.execute(text("SELECT n_fail, n_total FROM check_stat WHERE check_name = 'judge'")).one()
    assert (n_fail, n_total) == (0, 5)
    again = run_cli("judge", "judged", "--db", str(db_path), "--retry-errors", check=True)
    assert "retried 0 error verdicts" in again.stdout


def test_a_judge_still_failing_on_retry_leaves_a_new_error(tmp_path, sim, db_path, judge_server) -> None:  # type: ignore[no-untyped-def]
    gen = sim(seed=5, reasoning_tokens="3-5", content_tokens="3-5")
    data = prompts(tmp_path / "p.jsonl", 3)
    run_cli("run", "--dataset", str(data), "--base-url", gen, "--model", "sim-reasoner", "--db", str(db_path),
            "--name", "judged", "--quiet", check=True)
    cfg = tmp_path / "judge.toml"
    cfg.write_text(f'[judge]\nmodel = "judge"\nguided = "none"\nmax_attempts = 1\n[judge.endpoint]\n'
                   f'base_url = "{judge_server.url}"\n')
    judge_server.mode = "500"
    run_cli("judge", "judged", "--db", str(db_path), "--config", str(cfg), check=True)
    judge_server.mode = "prose"
    res = run_cli("judge", "judged", "--db", str(db_path), "--retry-errors", check=True)
    assert "retried 3 error verdicts; 3 still error" in res.stdout  # once each: the command ends
    assert all(v == ["error", "error"] for v in _verdict_rows(db_path, "judge").values())


def test_the_dashboards_start_validation_names_an_unimportable_user_check(tmp_path, engine) -> None:  # type: ignore[no-untyped-def]
    """The start form's validation (launch.validate: every problem, each beside its field, as a 400) refuses a
    configuration whose user check the worker it would start cannot import, naming it (#35)."""
    from synthwatch.app import launch
    from synthwatch.settings import Settings

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    ds = prompts(data_dir / "p.jsonl", 2)
    settings = Settings(db=str(tmp_path / "x.db"), launch_dataset_dirs=str(data_dir))
    base = {"dataset": {"path": str(ds)}, "endpoints": [{"base_url": "http://127.0.0.1:9/v1"}], "model": "m"}
    launch.validate(dict(base), engine, settings=settings, base_dir=tmp_path)  # without the check: fine
    with pytest.raises(launch.LaunchError) as refused:
        launch.validate({**base, "checks": {"user": [{"name": "mine", "function": "swtest_nowhere:check"}]}},
                        engine, settings=settings, base_dir=tmp_path)
    # the settings policy refuses the import path itself (#34), before anything tries to import it
    assert "checks.user[0].function" in str(refused.value)
    assert "swtest_nowhere" not in sys.modules
