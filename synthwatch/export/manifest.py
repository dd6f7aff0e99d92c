"""The manifest of an export (``<out>.manifest.json``): what went in, what was left out and why, and how."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import PurePath
from typing import Any
from urllib.parse import urlsplit

from .plan import PRESET_FORMATS, R_EMPTY, R_TRUNCATED, TOKEN_FORMATS, ExportPlan, version


def _check_words(name: str) -> str:
    from ..check_catalog import CHECK_INFO

    return CHECK_INFO.get(name) or name.replace("_", " ")


def build_manifest(plan: ExportPlan, scanned: int, exported: int, excluded: Counter[str], sources: Counter[str],
                   digest: str, size: int, started: float) -> dict[str, Any]:
    """The manifest written beside an export: counts, selection, file, format, tokens, preset, run config."""
    opts = plan.options
    not_ok = {s: n for s, n in sorted(plan.status_counts.items()) if s != "ok"}
    checks_applied = []
    for name in plan.checks:
        if name == R_EMPTY:
            rule = ("reasoning is empty or blank (the run expects reasoning)" if plan.expects_reasoning
                    else "not applied: the run does not expect reasoning")
        elif name == R_TRUNCATED:
            rule = "finish_reason == 'length'"
        else:
            # a sentence, not "check_flags has bit 4" (#37); the bit stays beside it for programs
            rule = _check_words(name)
            checks_applied.append({"name": name, "rule": rule, "check_flags_bit": plan.check_bits[name]})
            continue
        checks_applied.append({"name": name, "rule": rule})
    crit = plan.criteria
    for name in (crit.exclude_verdicts if crit is not None else ()):  # checks with stored verdicts (#38)
        entry = crit.cat.entries[name]
        checks_applied.append({"name": name, "rule": entry.info or entry.kind,
                               "verdict": "its latest verdict is fail (check_verdict)"})
    tok: dict[str, Any] | None = None
    if opts.format in TOKEN_FORMATS:
        as_generated = opts.format == "speculators" or opts.template_drops_past_reasoning
        tok = {
            "sources": dict(sources),
            "server_token_ids": plan.server_ids,
            "loss_mask": "0 over the prompt, 1 over the assistant turn",
            "split": "token level: the server's prompt/completion ids, or the generation prompt's ids when they "
                     "are a prefix of the full render's ids (else the record is left out: prompt_not_prefix)",
            "retokenized_answer": (
                "appended as generated: generation prompt + [<think>]reasoning</think>content + EOS, the </think> "
                "only when the model wrote it (an answer follows its reasoning) and the EOS only when it stopped by "
                "itself (finish_reason 'stop', no stop string)"
                if as_generated else "rendered by the chat template; a record whose reasoning the template drops "
                                     "is left out (template_drops_reasoning), a truncated row ends where the model's "
                                     "text ends (no end of turn), a reply that stopped inside its reasoning is left "
                                     "out (reasoning_not_closed)"),
            "tokenizer": plan.tokenizer_info,
            "chat_template": plan.tokenizer.template_source if plan.tokenizer else None,
        }
    elif opts.format == "specforge":
        tok = {"reasoning_check": (
            f"rows rendered with {plan.tokenizer.template_source} ({plan.tokenizer.spec.name_or_path}); rows whose "
            "reasoning it drops are left out" if plan.tokenizer else "no tokenizer: not checked"),
            "tokenizer": plan.tokenizer_info}
    preset = None
    if opts.format in PRESET_FORMATS:
        from .presets import PRESETS

        preset = PRESETS[opts.format].manifest()
    return {
        "synthwatch_version": version(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": round(time.time() - started, 3),
        "file": {"name": plan.out.name, "path": str(plan.out), "bytes": size, "sha256": digest,
                 "container": "parquet" if plan.parquet else "jsonl"},
        "format": opts.format,
        "format_options": {
            "think_inline": opts.think_inline if opts.format == "sharegpt" else None,
            "from_value": opts.from_value if opts.format == "sharegpt" else None,
            "think_open": plan.think_open, "think_close": plan.think_close,
            "retokenize": opts.retokenize if opts.format in TOKEN_FORMATS else None,
            "template_drops_past_reasoning": opts.template_drops_past_reasoning,
        },
        "run": {"id": plan.run["id"], "name": plan.run["name"], "status": plan.run["status"],
                "database": plan.db_url},
        "selection": {
            "only_ok": True,
            "only_good": opts.only_good,
            "include_flagged": opts.include_flagged,
            "default_exclusions": opts.default_exclusions,
            "checks_applied": checks_applied,
            "precedence": "each excluded record is counted once, under the first reason that applies: "
                          "review, then the checks in the order listed",
        },
        "counts": {
            "records_in_run": sum(plan.status_counts.values()),
            "not_ok": not_ok,
            "ok_scanned": scanned,
            "exported": exported,
            "excluded": dict(sorted(excluded.items())),
            "excluded_total": sum(excluded.values()),
        },
        # the cut (#35): the export read the ok records finished by the time it started, none finished since
        "snapshot": None if plan.snapshot_at is None else {
            "finished_before": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(plan.snapshot_at))
                               + f".{int(plan.snapshot_at % 1 * 1000):03d}Z",
            "finished_before_epoch_s": plan.snapshot_at,
            "ok_records": plan.total,
            "note": "only ok records finished at or before this time were read; records finished (or re-run) while "
                    "the export ran are not in it, whatever their checks say",
        },
        # what was still open when the export started, and who chose to export anyway (#26)
        "open_items": list(opts.open_items),
        "confirmed_with_open_alarms": opts.confirmed_by is not None,
        # settings changes that weakened detection on this run, each with its reason, who and when (#35)
        "overrides": [{"kind": o["kind"], "check": o["check_name"], "what": o["detail"], "reason": o["reason"],
                       "by": o["actor"], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(o["created_at"])))}
                      for o in plan.overrides],
        "confirmed_by": opts.confirmed_by,
        "confirmed_at": (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(opts.confirmed_at))
                         if opts.confirmed_at else None),
        "tokens": tok,
        "preset": preset,
        "run_config": plan.config,
    }


# an absolute path in text: at the start, after white space, a quote, a bracket, "=", "," or a "file:" label
_ABS_PATH = re.compile(r"""(?:(?<=^)|(?<=[\s'"(\[=,])|(?<=file:))(?:~|[A-Za-z]:)?[/\\][^\s'"(),\[\]]*""")


def _name_of(match: re.Match[str]) -> str:
    path = match.group(0).rstrip(".:;")
    tail = match.group(0)[len(path):]
    return (PurePath(path.replace("\\", "/")).name or "…") + tail


def without_paths(text: str) -> str:
    """``text`` with each absolute file path replaced by its file name (the server's layout is not shown)."""
    return _ABS_PATH.sub(_name_of, text) if ("/" in text or "\\" in text) else text


def _database(url: str) -> str:
    """A database URL as a client may see it: the SQLite file's name, or the server and database without user."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<database>"
    if parts.scheme.startswith("sqlite"):
        return f"{parts.scheme}:///{PurePath(parts.path).name}"
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}/{parts.path.lstrip('/')}"


_NOT_PATHS = {"stop", "extra_body", "think_open", "think_close"}  # model text, which may well start with "/"


def public_manifest(manifest: Any) -> Any:
    """The manifest as the dashboard and its API serve it: the same facts with no server file path (file names
    only; the database as its file name, or host and name). The file beside the export keeps the full paths for
    whoever has the file system anyway."""
    def clean(value: Any, key: str = "") -> Any:
        if key in _NOT_PATHS:
            return value
        if isinstance(value, dict):
            return {k: clean(v, str(k)) for k, v in value.items() if not (key == "file" and k == "path")}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return _database(value) if key == "database" else without_paths(value)
        return value

    return clean(manifest)
