"""The worker's process imports only what it uses (#39 item 3: the whole `synthwatch run` process's start-up): the ORM
models (SQLModel, SQLAlchemy's ORM, ~0.1-0.25 CPU-s) are the dashboard's and the migrations', never the worker's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER_PATH = ("synthwatch.commands.run", "synthwatch.workers.engine", "synthwatch.quality.live",
               "synthwatch.sources.load", "synthwatch.store.db", "synthwatch.store.fresh", "synthwatch.workers.preflight")


def test_the_worker_path_does_not_import_the_orm() -> None:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in WORKER_PATH)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlmodel' or m.startswith('sqlalchemy.orm')"
              " or m == 'synthwatch.store.models'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_statuses_are_the_models_statuses() -> None:
    from synthwatch.store import models, statuses

    for name in ("RUN_STATUSES", "LIVE_STATUSES", "DESIRED_STATES", "RECORD_STATUSES", "FINISHED_STATUSES"):
        assert getattr(models, name) is getattr(statuses, name)
