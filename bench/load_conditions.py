"""The host conditions of #39 under which `bench scale` runs: competing load, a stopped worker, a CPU quota.

- ``quiet``: nothing else started;
- ``load25`` / ``load50``: a process on the worker's core busy 25% / 50% of every 100 ms;
- ``sigstop``: the worker held (SIGSTOP) 2 s in every 10 s;
- ``heavy``: five busy processes on both cores (the simulator starved too: load 5 and more) and the worker in a
  cgroup with a CPU quota of half a core (cgroup v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``; where no cgroup can be
  made, the five busy processes alone, and the result says so).

Every process started here is ended by its id when the condition ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

CONDITIONS = ("quiet", "load25", "load50", "sigstop", "heavy")
QUOTA_SHARE = 0.5  # of one core, for the worker under ``heavy``
_CGROUP = "synthwatch-bench-scale"


def _busy(share: float, core: int | None) -> subprocess.Popen[bytes]:
    """A process busy ``share`` of every 100 ms (1.0: always), pinned to ``core`` when given."""
    code = ("import time\n"
            f"busy, period = {share} * 0.1, 0.1\n"
            "while True:\n"
            "    t = time.perf_counter()\n"
            "    while time.perf_counter() - t < busy: pass\n"
            "    if period > busy: time.sleep(period - busy)\n")
    pre = (lambda: os.sched_setaffinity(0, {core})) if core is not None and (os.cpu_count() or 1) > 1 else None
    return subprocess.Popen([sys.executable, "-c", code], preexec_fn=pre)


def _cgroup(pid: int, share: float) -> tuple[Path | None, str]:
    """Put ``pid`` in a new cgroup limited to ``share`` of a core: (its folder, what was done)."""
    v2 = Path("/sys/fs/cgroup")
    v1 = v2 / "cpu"
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            d = v1 / _CGROUP
            d.mkdir(exist_ok=True)
            (d / "cpu.cfs_period_us").write_text("100000")
            (d / "cpu.cfs_quota_us").write_text(str(int(100000 * share)))
            (d / "cgroup.procs").write_text(str(pid))
            return d, f"worker in cgroup v1 {d} with cpu.cfs_quota_us {int(100000 * share)} / 100000"
        if (v2 / "cgroup.controllers").exists():
            d = v2 / _CGROUP
            d.mkdir(exist_ok=True)
            (d / "cpu.max").write_text(f"{int(100000 * share)} 100000")
            (d / "cgroup.procs").write_text(str(pid))
            return d, f"worker in cgroup v2 {d} with cpu.max {int(100000 * share)} 100000"
    except OSError as exc:
        return None, f"no cgroup could be made here ({exc}): five busy processes only"
    return None, "no cgroup file system here: five busy processes only"


def _uncgroup(d: Path, pid: int) -> None:
    with contextlib.suppress(OSError):
        (d.parent / "cgroup.procs").write_text(str(pid))
    with contextlib.suppress(OSError):
        d.rmdir()


@contextlib.contextmanager
def condition(name: str, worker_pid: int, worker_core: int | None, quota_share: float = QUOTA_SHARE) -> Iterator[str]:
    """Apply ``name`` to the worker process for the duration of the block; yields a one-line description.
    ``quota_share``: the worker's CPU quota under ``heavy``, in cores."""
    if name not in CONDITIONS:
        raise ValueError(f"unknown condition {name!r}: one of {', '.join(CONDITIONS)}")
    procs: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    thread: threading.Thread | None = None
    group: Path | None = None
    what = "quiet: nothing else started by the benchmark"
    try:
        if name in ("load25", "load50"):
            share = 0.25 if name == "load25" else 0.5
            procs.append(_busy(share, worker_core))
            what = f"a process busy {share:.0%} of every 100 ms on the worker's core"
        elif name == "sigstop":
            def duty() -> None:
                while not stop.wait(8.0):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker_pid, signal.SIGSTOP)
                    stop.wait(2.0)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker_pid, signal.SIGCONT)
            thread = threading.Thread(target=duty, daemon=True)
            thread.start()
            what = "the worker held (SIGSTOP) 2 s in every 10 s"
        elif name == "heavy":
            procs += [_busy(1.0, None) for _ in range(5)]
            group, how = _cgroup(worker_pid, quota_share)
            what = f"five busy processes on both cores (simulator starved too); {how}"
        yield what
    finally:
        stop.set()
        if thread is not None:
            thread.join()
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker_pid, signal.SIGCONT)
        for p in procs:
            p.kill()
            p.wait()
        if group is not None:
            _uncgroup(group, worker_pid)


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "unknown"
