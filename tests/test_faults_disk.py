"""The database on a full disk: the worker pauses with a clear error and continues when space returns."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import popen_cli, require
from workerkit import answer_ok, counts, records, run_row, wait_for

from synthwatch.store.db import open_engine


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    require(os.geteuid() == 0, "mounting a small tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, text=True)
    require(proc.returncode == 0, f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Take every free byte of the filesystem (unbuffered writes: nothing left to flush)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError:
                    break
    finally:
        os.close(fd)


# Over 30 s (~55 s here): a real 6 MB tmpfs fills, the writer stalls on it and retries, and the test frees room and
# waits for the run to finish without a lost or doubled record; the fill and the retry backoff are the time.
@pytest.mark.slow
def test_full_disk_pauses_then_continues_losing_nothing(small_disk: Path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=3, tokens_per_s=400, reasoning_tokens="150-250", content_tokens="20")
    db = small_disk / "run.db"
    proc = popen_cli("run", "--dataset", str(prompts(600)), "--base-url", url, "--model", "sim-reasoner",
                     "--db", str(db), "--name", "disk", "--concurrency", "8", "--log-json")
    lines: list[dict] = []
    errs: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                lines.append(json.loads(line))

    def read_err() -> None:
        assert proc.stderr is not None
        errs.extend(proc.stderr)

    for target in (read, read_err):
        threading.Thread(target=target, daemon=True).start()
    engine = open_engine(str(db))
    wait_for(lambda: _n_ok(engine) >= 20, timeout_s=60, what="records before the disk fills")
    filler = small_disk / "filler.bin"
    _fill(filler)
    try:
        wait_for(lambda: any(x.get("db_error") and "full" in x["db_error"] for x in lines), timeout_s=30,
                 what="the worker to report the full disk")
    except AssertionError:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{lines[-3:]}\n{''.join(errs)[-3000:]}") from None
    # while the disk is full nothing new is claimed: the in-flight count drains
    wait_for(lambda: lines and lines[-1]["in_flight"] == 0, timeout_s=30, what="in-flight requests to drain")
    time.sleep(1.0)
    filler.unlink()
    proc.wait(timeout=120)
    time.sleep(0.2)
    err = "".join(errs)
    assert proc.returncode == 0, err
    assert "disk is full" in err or any("full" in (x.get("db_error") or "") for x in lines)
    run = run_row(engine, "disk")
    c = counts(engine, run["id"])
    assert c == {"ok": 600}, c
    assert all(answer_ok(r) for r in records(engine, run["id"]))


def _n_ok(engine) -> int:  # type: ignore[no-untyped-def]
    from synthwatch.store.queue import NotFound

    try:
        return int(run_row(engine, "disk")["n_ok"])
    except NotFound:
        return 0
