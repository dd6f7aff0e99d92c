"""`synthwatch watch FILE` (follow a JSONL file another program writes) and `synthwatch import FILE...`."""

from __future__ import annotations

import argparse
import glob
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ..capture.reasoning import MODES as REASONING_MODES
from ..cli import CliError
from ..store.dashboards import run_link
from ._common import add_db_arg, add_flag, dashboard_hint, positive_int

MAX_BAD_SHOWN = 20
PEEK_LINES = 200


def _common(p: argparse.ArgumentParser) -> None:
    add_db_arg(p)
    p.add_argument("--run", metavar="NAME", help="run to ingest into (default: the file name without extension); "
                   "an existing watched run continues where it stopped")
    p.add_argument("--map", action="append", metavar="KEY=PATH", default=[],
                   help="read a field from a dotted path, e.g. --map reasoning=msg.reasoning (repeatable; keys: "
                   "prompt, messages, reasoning, content, finish_reason, id, prompt_tokens, completion_tokens, "
                   "latency_s, timestamp, model, error)")
    p.add_argument("--shape", help="force one shape instead of detecting it per line (chat.completion, openai-batch, "
                   "script, record, specforge, conversations, messages)")
    p.add_argument("--reasoning-mode", default="auto",
                   choices=REASONING_MODES,
                   help="where the reasoning is read from (default: auto, like generated runs)")
    add_flag(p, "--no-reasoning-expect", "--no-expect-reasoning", dest="expect_reasoning", action="store_false",
                   help="the model is not a reasoning model: empty reasoning is not an alarm")
    p.add_argument("--quiet", action="store_true", help="only errors and the final summary")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "watch",
        help="follow a JSONL file another generator is writing (like tail -F) into a run",
        description="Each complete new line becomes a record of the run within a poll interval; a half-written "
        "last line waits until complete; rotation (rename + new file) and truncation are handled; restarting "
        "resumes at the stored offset (no record doubled or missed). See docs/watch.md.",
    )
    p.add_argument("file", help="the JSONL file to follow (it may not exist yet)")
    _common(p)
    p.add_argument("--poll-interval-ms", type=positive_int, default=200, help="how often to look for new lines")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--from-start", dest="from_end", action="store_false", default=False,
                   help="a new watch reads the file from its first line (default)")
    g.add_argument("--from-end", dest="from_end", action="store_true",
                   help="a new watch ingests only lines written from now on")
    p.set_defaults(func=handle_watch)

    p = sub.add_parser(
        "import",
        help="ingest finished JSONL files (globs, several files, .gz) into a run",
        description="Same shapes and mapping as `watch`. Importing a file again into the same run reads only "
        "what was not read before. Exits non-zero only if nothing could be read.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="files or glob patterns (quote them to let us expand)")
    _common(p)
    p.set_defaults(func=handle_import)


# ------------------------------------------------------------------------------------------ helpers


def _parser(a: argparse.Namespace) -> Any:
    from ..sources.ingest import LineParser, MapError, parse_map

    try:
        return LineParser(shape=a.shape, mapping=parse_map(a.map), reasoning_mode=a.reasoning_mode)
    except MapError as exc:
        raise CliError(str(exc)) from None


def _default_name(path: str) -> str:
    return Path(path).name.split(".")[0] or "watched"


def _engine(a: argparse.Namespace) -> Any:
    from ..store.db import DatabaseError, open_engine

    try:
        return open_engine(a.db)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None


def peek(path: Path, a: argparse.Namespace) -> tuple[str, str | None, list[tuple[int, str]], int]:
    """Classify the first lines of a file: (shape report, model, unmatched (line, reason), lines recognised)."""
    from ..sources.follow import open_sequential
    from ..sources.ingest import LineError

    parser = _parser(a)
    model = None
    bad: list[tuple[int, str]] = []
    try:
        fh = open_sequential(path)
    except OSError:
        return "file not readable yet", None, [], 0
    with fh:
        for no, raw in enumerate(fh, 1):
            if no > PEEK_LINES:
                break
            if not raw.endswith(b"\n") or not raw.strip():
                continue
            try:
                p = parser.parse(raw.rstrip(b"\r\n"))
            except (LineError, ValueError, TypeError) as exc:
                bad.append((no, str(exc)))
                continue
            if model is None and p.extracted is not None and p.extracted.model:
                model = p.extracted.model
    n = sum(parser.counts.values())
    if n:
        report = f"{parser.describe()} (first {n + len(bad)} lines)"
    elif bad:
        report = "no line matches a known shape so far"
    else:
        report = "nothing yet (the file has no complete line): the shape is reported when lines arrive"
    return report, model, bad, n


class Reporter:
    """Prints unmatched lines (the first MAX_BAD_SHOWN) and a running summary."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.shown = 0
        self.hidden = 0

    def bad(self, where: str, line: int, reason: str) -> None:
        if self.shown < MAX_BAD_SHOWN:
            self.shown += 1
            print(f"  {where}:{line}: unmatched: {reason}", file=sys.stderr, flush=True)
        else:
            self.hidden += 1

    def on_batch(self, where: str, res: Any) -> None:
        for line, reason in res.bad:
            self.bad(where, line, reason)

    def close(self) -> None:
        if self.hidden:
            print(f"  ... and {self.hidden} more unmatched lines (all are listed in the run's ingest errors)",
                  file=sys.stderr)


def _run_checks(engine: Any, name: str, config: Any) -> None:
    """An existing run keeps the check settings stored with it (a `synthwatch checks RUN --config` since it was
    created); a user check among them that cannot be imported refuses the command before anything is read (#35)."""
    from ..sources.watch import stored_checks
    from .run import refuse_unloadable_checks

    stored = stored_checks(engine, name)
    if stored is not None:
        config.checks = stored
    refuse_unloadable_checks(config.checks)


def _hooks(engine: Any, run_id: int, config: Any, quiet: bool) -> list[Any]:
    from ..config import ConfigError
    from ..sources.watch import check_hooks

    try:
        hooks = check_hooks(engine, run_id, config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if not hooks and not quiet:
        print("  (data-quality checks are not available in this build: records are stored without them)",
              file=sys.stderr)
    return hooks


# ------------------------------------------------------------------------------------------ watch


def _fail(engine: Any, run_id: int, message: str) -> None:
    from sqlalchemy.exc import DBAPIError

    from ..sources.watch import finish_run

    try:
        finish_run(engine, run_id, "failed", message)
    except DBAPIError:
        pass  # the database itself is the problem; the message is printed anyway


def handle_watch(a: argparse.Namespace) -> int:
    from sqlalchemy.exc import DBAPIError

    from ..sources.follow import Follower
    from ..sources.watch import Ingestor, WatchError, finish_run, open_run, watch_config
    from ..store.db import safe_url

    path = str(Path(a.file).expanduser().absolute())
    if Path(path).is_dir():
        raise CliError(f"{a.file} is a folder; give the JSONL file to follow")
    if Path(path).exists():
        with open(path, "rb") as probe:
            if probe.read(2) == b"\x1f\x8b":
                raise CliError(f"{a.file} is gzip-compressed: a compressed file cannot be followed; "
                               "use `synthwatch import` for finished .gz files")
    parser = _parser(a)
    name = a.run or _default_name(path)
    report, model, bad, recognised = (peek(Path(path), a) if Path(path).exists()
                                      else ("file does not exist yet", None, [], 0))
    engine = _engine(a)
    config = watch_config(name, path, model=model, expect_reasoning=a.expect_reasoning,
                          reasoning_mode=a.reasoning_mode)
    _run_checks(engine, name, config)
    try:
        run_id, existed = open_run(engine, name, config, status_message=f"watching {path}")
    except WatchError as exc:
        raise CliError(str(exc)) from None
    except DBAPIError as exc:
        raise CliError(f"database error: {exc.orig}") from None
    out = sys.stderr
    print(f"{'continuing' if existed else 'watching'} {path} into run {name!r} (id {run_id}) in "
          f"{safe_url(str(engine.url))}", file=out)
    print(f"  recognised: {report}", file=out)
    if bad:
        print(f"  {len(bad)} of the first lines match no shape, e.g. line {bad[0][0]}: {bad[0][1]}", file=out)
    print(f"  {run_link(engine, run_id, dashboard_hint(a.db))}", file=out, flush=True)
    hooks = _hooks(engine, run_id, config, a.quiet)
    reporter = Reporter(a.quiet)
    ing = Ingestor(engine, run_id, parser, hooks=hooks)
    say = (lambda s: None) if a.quiet else (lambda s: print(f"  {s}", file=out, flush=True))
    last = [time.monotonic(), 0]
    announced = [recognised > 0]

    def on_batch(where: str, res: Any) -> None:
        reporter.on_batch(where, res)
        if not announced[0] and ing.parser.counts:
            announced[0] = True
            print(f"  recognised: {ing.parser.describe()}", file=out, flush=True)
        n = ing.total_ok + ing.total_error + ing.total_bad
        if not a.quiet and time.monotonic() - last[0] >= 10 and n != last[1]:
            last[0], last[1] = time.monotonic(), n
            print(f"  {name}: +{ing.total_ok} ok, +{ing.total_error} error, +{ing.total_bad} unmatched "
                  f"(line {follower.src.line_no})", file=out, flush=True)

    follower = Follower(ing, path, poll_interval_s=a.poll_interval_ms / 1000, from_end=a.from_end, say=say,
                        on_batch=on_batch)
    if existed and a.from_end and follower.src.inode is not None:
        say("--from-end applies to a new watch only: resuming at the stored position")

    def on_signal(signum: int, _frame: Any) -> None:
        follower.stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        why = follower.run()
    except WatchError as exc:
        _fail(engine, run_id, str(exc))
        raise CliError(str(exc)) from None
    except OSError as exc:
        _fail(engine, run_id, f"{path}: {exc}")
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    except DBAPIError as exc:
        _fail(engine, run_id, f"database error: {exc.orig}")
        raise CliError(f"database error while watching (the stored position is intact; run the same command "
                       f"again to continue): {exc.orig}") from None
    reporter.close()
    msg = (f"watch of {path} ended ({why}) at line {follower.src.line_no}: this session +{ing.total_ok} ok, "
           f"+{ing.total_error} error, +{ing.total_bad} unmatched")
    finish_run(engine, run_id, "stopped", msg)
    print(msg, file=out)
    return 0


# ------------------------------------------------------------------------------------------ import


def expand(patterns: list[str]) -> tuple[list[Path], list[str]]:
    files: list[Path] = []
    missing: list[str] = []
    seen: set[Path] = set()
    for pat in patterns:
        matches = sorted(glob.glob(str(Path(pat).expanduser()))) if glob.has_magic(pat) else [pat]
        if not matches:
            missing.append(f"{pat}: no file matches")
            continue
        for m in matches:
            p = Path(m).expanduser()
            if p.is_dir():
                missing.append(f"{m}: is a folder")
            elif not p.exists():
                missing.append(f"{m}: no such file")
            elif p.resolve() not in seen:
                seen.add(p.resolve())
                files.append(p)
    return files, missing


def handle_import(a: argparse.Namespace) -> int:
    from sqlalchemy.exc import DBAPIError

    from ..sources.follow import import_file
    from ..sources.watch import Ingestor, WatchError, finish_run, open_run, watch_config
    from ..store.db import safe_url

    files, missing = expand(a.files)
    if not files:
        raise CliError("nothing to import: " + "; ".join(missing))
    for m in missing:
        print(f"synthwatch import: skipped {m}", file=sys.stderr)
    parser = _parser(a)
    name = a.run or _default_name(str(files[0]))
    _, model, _, _ = peek(files[0], a)
    engine = _engine(a)
    config = watch_config(name, str(files[0].resolve()), model=model, expect_reasoning=a.expect_reasoning,
                          reasoning_mode=a.reasoning_mode)
    _run_checks(engine, name, config)
    try:
        run_id, existed = open_run(engine, name, config, status_message=f"importing {len(files)} file(s)")
    except WatchError as exc:
        raise CliError(str(exc)) from None
    except DBAPIError as exc:
        raise CliError(f"database error: {exc.orig}") from None
    out = sys.stderr
    print(f"importing {len(files)} file(s) into run {name!r} (id {run_id}{', existing' if existed else ''}) in "
          f"{safe_url(str(engine.url))}", file=out)
    hooks = _hooks(engine, run_id, config, a.quiet)
    ing = Ingestor(engine, run_id, parser, hooks=hooks)
    reporter = Reporter(a.quiet)
    say = (lambda s: None) if a.quiet else (lambda s: print(f"  {s}", file=out, flush=True))
    total = failed_files = 0
    already = 0
    for f in files:
        before = dict(parser.counts)
        try:
            ok, err, bad, resumed = import_file(ing, f, say=say, on_batch=reporter.on_batch)
        except (OSError, EOFError) as exc:  # unreadable / corrupt gzip: report, go on with the others
            failed_files += 1
            print(f"  {f}: cannot read: {getattr(exc, 'strerror', None) or exc}", file=out)
            continue
        except WatchError as exc:
            _fail(engine, run_id, str(exc))
            raise CliError(str(exc)) from None
        except DBAPIError as exc:
            _fail(engine, run_id, f"database error: {exc.orig}")
            raise CliError(f"database error while importing {f} (what was committed stays; run the same "
                           f"command again to continue): {exc.orig}") from None
        total += ok + err
        shapes = {k: v - before.get(k, 0) for k, v in parser.counts.items() if v - before.get(k, 0)}
        shape_txt = ", ".join(f"{k} ×{v}" for k, v in shapes.items()) or "no records"
        note = " (continued from where the last import stopped)" if resumed else ""
        if resumed and ok + err + bad == 0:
            already += 1
            note = " (already imported: nothing new)"
        print(f"  {f}: {ok} ok, {err} error, {bad} unmatched — {shape_txt}{note}", file=out, flush=True)
    reporter.close()
    print(f"  recognised: {parser.describe()}", file=out)
    status_msg = f"imported {len(files)} file(s): {ing.total_ok} ok, {ing.total_error} error, {ing.total_bad} unmatched"
    finish_run(engine, run_id, "completed", status_msg)
    print(f"run {name!r}: {status_msg}", file=out)
    print(f"  {run_link(engine, run_id, dashboard_hint(a.db))}", file=out)
    if total == 0 and already < len(files):
        print("synthwatch import: error: no record could be read", file=out)
        return 1
    return 0
