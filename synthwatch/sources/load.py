"""Load a dataset into a new run (the database is the queue), or find the run to resume.

Called by `synthwatch run`, by the dashboard's start-a-run form (app/launch.py), and by tests and
benchmarks that need a loaded run.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Any


class RunLoadError(Exception):
    """The run cannot be created or loaded (bad dataset, bad check settings, a name taken by another kind
    of run); the message is for the user."""


def default_name(config: Any) -> str:
    stem = Path(config.dataset.path).name.split(".")[0] or "dataset"
    return f"{stem}-{config.model.split('/')[-1]}-{time.strftime('%Y%m%d-%H%M%S')}"


def _identity(dataset_path: str, base_urls: list[str], model: str) -> str:
    return "\n".join([str(Path(dataset_path).expanduser().resolve()), *sorted(u.rstrip("/") for u in base_urls),
                      model])


def stable_name(config: Any) -> str:
    """`synthwatch run`'s name when --name is not given: the same dataset, endpoints and model give the same name,
    so that typing the same command again resumes the run (<dataset>-<model>-<6 hex of path, endpoints, model>)."""
    stem = Path(config.dataset.path).name.split(".")[0] or "dataset"
    key = _identity(config.dataset.path, [e.base_url for e in config.endpoints], config.model)
    return f"{stem}-{config.model.split('/')[-1]}-{hashlib.sha256(key.encode()).hexdigest()[:6]}"


def matching_runs(conn: Any, config: Any) -> list[str]:
    """Names of generate runs with this dataset (same file), endpoints and model, oldest first."""
    import json

    from sqlalchemy import text

    want = _identity(config.dataset.path, [e.base_url for e in config.endpoints], config.model)
    out = []
    for name, cfg in conn.execute(text("SELECT name, config_json FROM run WHERE kind = 'generate' ORDER BY id")):
        try:
            c = json.loads(cfg or "{}")
            key = _identity(c["dataset"]["path"], [e["base_url"] for e in c["endpoints"]], c["model"])
        except (ValueError, KeyError, TypeError):
            continue
        if key == want:
            out.append(str(name))
    return out


def prepare_run(engine: Any, config: Any, *, out: Any = sys.stderr) -> tuple[int, bool]:
    """Create the run and load its prompts, or find it to resume. Returns (run_id, resumed)."""
    from sqlalchemy import text

    from ..sources.datasets import DatasetError, load_dataset
    from ..store.queue import create_run, find_run_id, insert_prompts, write_begin

    with engine.connect() as conn:
        existing = find_run_id(conn, config.name)
        kind = conn.execute(text("SELECT kind FROM run WHERE id = :r"), {"r": existing}).scalar()
        conn.rollback()
    if existing is not None:
        if kind != "generate":
            raise RunLoadError(f"run {config.name!r} is a {kind} run (synthwatch {kind}); choose another --name")
        return existing, True
    d = config.dataset
    from ..quality.checks import ChecksConfigError, parse_settings, with_canaries

    try:
        check_settings = parse_settings(config.checks)
    except ChecksConfigError as exc:
        raise RunLoadError(str(exc)) from None
    from ..workers.judge import missing_fields, row_fields_read

    judge = getattr(config, "judge", None)
    try:
        loaded = load_dataset(config.dataset, tuple(dict.fromkeys(check_settings.row_fields()
                                                                  + row_fields_read(judge))))
    except DatasetError as exc:
        raise RunLoadError(str(exc)) from None
    missing = missing_fields(judge, (p.row for p in loaded.prompts))
    if missing:  # the judge would grade every record against an empty reference: refused before the first request
        from ..sources.datasets import field_names

        names = field_names(config.dataset)
        raise RunLoadError(
            f"judge.prompt_template uses {{reference}}, but no row of {d.path} has the field {missing[0]!r}"
            f" (judge.reference_field); the dataset's fields: {', '.join(names) or 'none found'}")
    k = config.samples_per_prompt
    per = f", {k} samples each: {len(loaded.prompts) * k} records" if k > 1 else ""
    print(f"dataset {d.path}: {len(loaded.prompts)} prompts ({loaded.shape}){per}", file=out)
    if loaded.bad_lines:
        print(f"  skipped {len(loaded.bad_lines)} malformed rows (--skip-bad-lines):", file=out)
        for bad in loaded.bad_lines[:10]:
            print(f"    {bad}", file=out)
    with engine.connect() as conn, write_begin(conn):
        run_id = create_run(conn, config.name, config)
        insert_prompts(conn, run_id, with_canaries(loaded.prompts, check_settings), turns=config.turns,
                       samples=config.samples_per_prompt)
        if loaded.bad_lines:
            conn.execute(
                text("INSERT INTO ingest_error (run_id, path, line, reason, t) VALUES (:r, :p, :l, :reason, :t)"),
                [{"r": run_id, "p": b.file, "l": b.line, "reason": b.reason, "t": time.time()}
                 for b in loaded.bad_lines],
            )
    return run_id, False
