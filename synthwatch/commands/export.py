"""`synthwatch export RUN --format F --out FILE`: write a run's reviewed data for training pipelines."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import TextIO

from ..cli import CliError
from ._common import add_db_arg, positive_int


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "export",
        help="export a run's ok records as messages / sharegpt / tokens / raw, or --for specforge / speculators",
        description="Streams the run's ok records to FILE (written as FILE.partial, renamed when complete) and "
        "writes FILE.manifest.json with the counts, every exclusion reason, the run config and the file's "
        "sha256. By default records flagged bad, records with empty reasoning (when the run expects reasoning) "
        "and truncated records (finish_reason 'length') are left out. See docs/export.md.",
    )
    add_db_arg(p)
    p.add_argument("run", metavar="RUN", help="run name or id")
    p.add_argument("--format", "-f", dest="fmt", metavar="FORMAT",
                   help="messages | sharegpt | tokens | raw (or a trainer preset: specforge | speculators)")
    p.add_argument("--for", dest="preset", metavar="TRAINER", choices=("specforge", "speculators"),
                   help="write exactly what this trainer's current reader takes: specforge (regenerated "
                        "conversations JSONL) | speculators (pre-tokenized JSONL); see docs/export.md")
    p.add_argument("--out", "-o", required=True, help="output file (.jsonl, or .parquet for tokens)")
    p.add_argument("--parquet", action="store_true", default=None,
                   help="write Parquet (tokens only; implied by a .parquet name)")
    p.add_argument("--think-inline", action="store_true",
                   help="sharegpt: put the reasoning inside the content between the run's think strings")
    p.add_argument("--from-value", action="store_true",
                   help="sharegpt: turns as from/value with human/gpt (EAGLE) instead of role/content (SpecForge)")
    p.add_argument("--turns", choices=("last", "all"), default="last",
                   help="conversations regenerated turn by turn (run setting turns = all): a row for the last "
                        "turn only (default) or one row per turn; only the row's answer is ever trained")
    g = p.add_argument_group("selection")
    g.add_argument("--only-good", action="store_true", help="export only records reviewed good")
    g.add_argument("--include-flagged", action="store_true", help="keep records flagged bad")
    g.add_argument("--exclude-check", action="append", default=[], metavar="NAME",
                   help="also leave out records failing this check (any check of the run: built-in, verify_*, "
                   "user:*, rule:*, language, near_duplicate, judge); repeat for several")
    g.add_argument("--where", metavar="EXPR",
                   help="only records this expression selects, e.g. \"verify:math=pass and language=pass and not "
                   "near_duplicate\" (grammar: docs/export.md)")
    g.add_argument("--no-default-exclusions", action="store_true",
                   help="keep records with empty reasoning and truncated records")
    g.add_argument("--config-version", type=positive_int, metavar="N",
                   help="only records whose current output was read under config version N (synthwatch versions RUN)")
    g.add_argument("--generated-under", type=positive_int, metavar="N",
                   help="only records generated under config version N")
    g.add_argument("--select", choices=("all", "passing", "first-passing", "best"), default="all",
                   help="k samples per prompt: export all of them (default), the passing ones, the first passing one "
                   "per prompt, or the best by its verdict's score; by the verdicts of --select-check. Records "
                   "without a verdict yet are left out and counted (no_verdict), never silently (docs/export.md)")
    g.add_argument("--select-check", action="append", default=[], metavar="CHECK",
                   help="a check whose verdicts --select reads (default: the run's first answer verifier; e.g. "
                   "judge); repeat for several: a sample passes when every one passes")
    g.add_argument("--require-pass", action="store_true",
                   help="--select best: leave out the prompts whose best sample did not pass (counted as no_pass)")
    g = p.add_argument_group("tokens")
    g.add_argument("--tokenizer", help="tokenizer folder or cached name (default: the run's)")
    g.add_argument("--chat-template", help="chat template file (.jinja) or 'deepseek-v4' (default: the run's)")
    g.add_argument("--trust-remote-code", action="store_true", default=None, help='let the tokenizer run its own code')
    g.add_argument("--retokenize", action="store_true",
                   help="re-tokenize even when the server's token ids are stored")
    g.add_argument("--template-drops-past-reasoning", action="store_true",
                   help="the chat template drops the reasoning of past turns by design (DeepSeek-R1 style): "
                        "append the answer as generated instead of rendering it (else such records are left out)")
    p.add_argument("--allow-open-alarms", action="store_true",
                   help="export although the run has an open data-quality alarm (it is refused otherwise, naming "
                        "each alarm and its failing records; see docs/export.md)")
    p.add_argument("--page-size", type=positive_int, default=5000, help=argparse.SUPPRESS)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=handle)


class ProgressBar:
    """A small progress bar on stderr: redrawn in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, label: str, stream: TextIO = sys.stderr, interval_s: float | None = None) -> None:
        self.label = label
        self.stream = stream
        self.tty = stream.isatty()
        self.interval_s = interval_s if interval_s is not None else (0.2 if self.tty else 5.0)
        self.started = time.monotonic()
        self.last = 0.0
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < self.interval_s:
            return
        self.last = now
        elapsed = max(now - self.started, 1e-6)
        rate = done / elapsed
        frac = done / total if total else 1.0
        eta = (total - done) / rate if rate > 0 and total > done else 0.0
        line = (f"{self.label} {done:>{len(f'{total:,}')},}/{total:,} {frac * 100:5.1f}% "
                f"{rate:,.0f} rec/s ETA {_clock(eta)}")
        if self.tty:
            width = 24
            fill = int(frac * width)
            self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {line}\x1b[K")
            self.drawn = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def handle(args: argparse.Namespace) -> int:
    from ..app.export_guard import left_out_for, manifest_items, open_alarms
    from ..export.plan import ExportError, ExportOptions
    from ..export.stream import manifest_path, prepare_export, run_export, sqlite_path
    from ..store.db import DatabaseError, is_sqlite, open_engine, resolve_url

    try:
        url = resolve_url(args.db)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None
    if is_sqlite(url):
        path = sqlite_path(url)
        if path is not None and not path.is_file():
            raise CliError(f"no database at {path} (give --db or set SYNTHWATCH_DB)")
    if args.preset and args.fmt and args.fmt != args.preset:
        raise CliError(f"--for {args.preset} writes its own format; drop --format {args.fmt}")
    fmt = args.preset or args.fmt
    if not fmt:
        raise CliError("give --format FORMAT or --for TRAINER (specforge | speculators)")
    options = ExportOptions(
        format=fmt, out=args.out, parquet=args.parquet, think_inline=args.think_inline,
        from_value=args.from_value,
        only_good=args.only_good, include_flagged=args.include_flagged,
        default_exclusions=not args.no_default_exclusions, exclude_checks=tuple(args.exclude_check),
        config_version=args.config_version, generated_under=args.generated_under,
        tokenizer=args.tokenizer, chat_template=args.chat_template, trust_remote_code=args.trust_remote_code,
        retokenize=args.retokenize, template_drops_past_reasoning=args.template_drops_past_reasoning,
        page_size=args.page_size, turns=args.turns, select=args.select,
        select_checks=tuple(args.select_check), where=args.where, require_pass=args.require_pass,
    )
    try:
        engine = open_engine(args.db, readonly=True)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None
    try:
        try:
            plan = prepare_export(engine, args.run, options)
        except ExportError as exc:
            raise CliError(str(exc)) from None
        with engine.connect() as conn:
            guard = open_alarms(conn, int(plan.run["id"]), left_out=left_out_for(
                plan.options, plan.select_checks, expects_reasoning=plan.expects_reasoning,
                also=plan.criteria.left_out() if plan.criteria is not None else ()))
        if guard is not None and guard.blocking and not args.allow_open_alarms:
            raise CliError(guard.message(cli=True))
        if guard is not None:
            # the manifest names what was open, and who exported anyway (#26)
            confirmed = guard.blocking
            plan.options = dataclasses.replace(
                plan.options, open_items=manifest_items(guard.items), confirmed_by="cli" if confirmed else None,
                confirmed_at=time.time() if confirmed else None)
            print(("warning: exporting with open alarms or problems: " if confirmed else "note: open problems: ")
                  + "; ".join(guard.lines()), file=sys.stderr)
        bar = None if args.quiet else ProgressBar(f"export {plan.run['name']} ({fmt})")
        try:
            manifest = run_export(engine, plan, bar)
        finally:
            if bar:
                bar.finish()
    finally:
        engine.dispose()
    counts = manifest["counts"]
    excl = ", ".join(f"{k} {v:,}" for k, v in counts["excluded"].items()) or "none"
    print(f"wrote {counts['exported']:,} of {counts['ok_scanned']:,} ok records to {plan.out}")
    print(f"excluded: {excl}")
    sel = (manifest.get("selection") or {}).get("per_prompt") or {}
    if sel.get("mode", "all") != "all":
        passk = sel.get("pass_at_k") or {}
        p1, pk = passk.get("pass_at_1"), passk.get("pass_at_k")
        print(f"selection {sel['mode']} by {' and '.join(sel['checks'])}: {sel['records_selected']:,} records from "
              f"{sel['prompts_selected']:,} of {sel['prompts']:,} prompts; {sel['records_lacking_verdict']:,} without a "
              f"verdict (left out, no_verdict); pass@1 {'-' if p1 is None else f'{p1:.3f}'}, "
              f"pass@{passk.get('k')} {'-' if pk is None else f'{pk:.3f}'}")
        best = sel.get("best")
        if best:
            print(f"best sample per prompt: passed in {best['prompts_best_passed']:,}, did not pass in "
                  f"{best['prompts_best_failed']:,}" + (" (left out: --require-pass)" if best["require_pass"] else
                                                         " (exported; --require-pass leaves them out)"))
    prompts = (manifest.get("selection") or {}).get("prompts") or {}
    if prompts and (sel.get("mode", "all") != "all" or manifest["selection"].get("expression")):
        print(f"prompts: {prompts['selected']:,} selected, {prompts['no_pass']:,} with no pass, "
              f"{prompts['pending']:,} pending, of {prompts['prompts']:,}")
    not_ok = counts["not_ok"]
    if not_ok:
        print("not ok (never exported): " + ", ".join(f"{k} {v:,}" for k, v in not_ok.items()))
    if manifest.get("open_items"):
        print(f"open problems named in the manifest: {len(manifest['open_items'])}"
              + (f" (exported anyway, confirmed by {manifest['confirmed_by']})" if manifest["confirmed_by"] else ""))
    print(f"manifest: {manifest_path(Path(plan.out))}  sha256 {manifest['file']['sha256'][:16]}…")
    for warning in manifest.get("warnings") or ():
        print(f"warning: {warning}", file=sys.stderr)
    preset = manifest.get("preset")
    if preset:
        checked = preset["checked_against"]
        print(f"for {preset['trainer']}, checked against {checked['package']} {checked['version']}; use:")
        for key, value in preset["settings"].items():
            print(f"  {key} = {value}")
    return 0
