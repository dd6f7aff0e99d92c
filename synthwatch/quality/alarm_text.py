"""What an alarm says: its message and proposed fix, from its evidence and the run's *current* settings.

An alarm row keeps its evidence (``alarm.evidence_json``: the fields a field mismatch found, the server's own
error text); the banner, the CLI and the API compute the words again from it with the run's settings as they
are now (:func:`render`), so a fix is never "set the mode to what it already is" after a settings change, an
undo or a re-derive. :func:`pause_text` says when a rule pauses the run.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..check_catalog import DEFAULT_RULES, Rule
from ..hints import command as hint
from ..redact import redact

SERVER_SAID_CHARS = 300  # the server's own error text, bounded (it is untrusted and may be large)


def _reads(mode: str) -> str:
    if mode == "none":
        return "no reasoning field (mode `none`)"
    return "inline `<think>` tags" if mode == "inline" else f"`{mode}`"


def server_said(message: str | None) -> str:
    """A server's error text for an alarm: redacted again (defence in depth) and bounded."""
    text = redact(" ".join((message or "").split()))
    return text if len(text) <= SERVER_SAID_CHARS else text[: SERVER_SAID_CHARS - 1] + "…"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%" if abs(x * 100 - round(x * 100)) < 1e-9 else f"{x * 100:g}%"


def pause_text(rule: Rule) -> str:
    """When this rule pauses the run, in words for the banner: "pauses at ≥ 50% over the last 100 records"."""
    if not (rule.enabled and rule.auto_pause):
        return "does not pause the run"
    over = (f"over the last {rule.window} records" if rule.pause_min_records >= rule.window
            else f"over the last {rule.window} records (from {rule.pause_min_records} on)")
    if rule.pause_threshold <= 0:
        return "pauses the run at the first failing record" if rule.pause_min_records <= 1 \
            else f"pauses at any failure {over}"
    return f"pauses at ≥ {_pct(rule.pause_threshold)} {over}"


def evidence(alarm: dict[str, Any]) -> dict[str, Any]:
    try:
        ev = orjson.loads(alarm.get("evidence_json") or "{}")
    except orjson.JSONDecodeError:
        return {}
    return ev if isinstance(ev, dict) else {}


def current_mode(config: dict[str, Any]) -> str:
    r = config.get("reasoning") if isinstance(config, dict) else None
    mode = r.get("mode") if isinstance(r, dict) else None
    return str(mode) if mode else "auto"


def hint_ctx(run_name: str | None, conn: Any = None) -> dict[str, Any]:
    """What the commands in an alarm's fix fill in (#37): the run's name and the database ``conn`` is on."""
    out: dict[str, Any] = {"run_name": run_name}
    if conn is not None:
        out["db"] = conn.engine.url.render_as_string(hide_password=True)
    return out


def _cmd(ctx: dict[str, Any], *words: object) -> str:
    """A command of an alarm's fix, with the run and the database filled in when ctx knows them."""
    name = ctx.get("run_name")
    return hint(*words, run=str(name) if name else "RUN", db=ctx.get("db"))


def render(alarm: dict[str, Any], config: dict[str, Any], rules: dict[str, Rule] | None = None, *,
           run_name: str | None = None, conn: Any = None) -> dict[str, Any]:
    """The alarm with its message and fix computed from its evidence and the run's current settings, and the
    text of when its rule pauses. Rows without evidence (made before it was kept) keep their stored words.
    ``run_name`` and ``conn`` fill the commands of its fix (hint_ctx)."""
    rule = (rules or DEFAULT_RULES).get(alarm["rule"]) or DEFAULT_RULES.get(alarm["rule"])
    out = dict(alarm)
    if rule is None:
        return out
    out["pause_text"] = pause_text(rule)
    ev = evidence(alarm)
    if ev.get("ctx") is not None:
        ctx = {**ev["ctx"], "current_mode": current_mode(config), **hint_ctx(run_name, conn)}
        w = ev.get("counts") or [0, 0, 0, 0]
        out["message"], fix = describe(rule, int(w[0]), int(w[1]), int(w[2]), int(w[3]), ctx)
        out["fix"] = fix or out.get("fix")
    return out


def _fields_text(fields: list[str]) -> str:
    names = [("inline `<think>` tags in the content" if f == "inline" else f"`{f}`") for f in fields]
    return " and ".join(names) if names else "another field"


def describe(rule: Rule, fail: int, total: int, run_fail: int, run_total: int, ctx: dict[str, Any]) -> tuple[str, str]:
    """(message, fix) in plain words for an alarm of this rule; ctx holds the latest failure's details. A failure
    seen on a stream in flight (synthwatch.quality.inflight) names that stream: its record, the delta, the text."""
    msg, fix = _describe(rule, fail, total, run_fail, run_total, ctx)
    if ctx.get("in_flight") and ctx.get("record_id") is not None:
        # model text: bounded, without the backticks the banner reads as code
        excerpt = " ".join(str(ctx.get("excerpt") or "").replace("`", "'").split())[-120:]
        on = f" on {ctx['endpoint']}" if ctx.get("endpoint") else ""
        msg += (f" Seen on a stream in flight{on}: record {ctx['record_id']} at delta {ctx.get('delta')}"
                + (f", \u201c{excerpt}\u201d." if excerpt else "."))
    return msg, fix


def _describe(rule: Rule, fail: int, total: int, run_fail: int, run_total: int, ctx: dict[str, Any]
              ) -> tuple[str, str]:
    share = f"{fail} of the last {total} records" if total else f"{fail} records"
    whole = f" ({run_fail} of {run_total} in the whole run)" if run_total else ""
    mode = ctx.get("mode") or "auto"
    name = rule.name
    if name == "field_mismatch":
        fields = sorted(ctx.get("fields") or [])
        where = _fields_text(fields)
        made = ctx.get("mode")  # what the run read when these records were made (unknown after a repair's reload)
        now = ctx.get("current_mode") or made or "auto"
        mode = made or ("another field" if fields and (now == "auto" or now in fields) else now)
        rederive = ("re-derive the affected records: their reasoning is in the raw unread field, so no new request "
                    f"is needed (`{_cmd(ctx, 'rederive', '--check', 'field_mismatch')}`).")
        if fields and now != mode and (now == "auto" or now in fields):
            # the settings were fixed after these records were made: the fix left is the re-derive, never
            # "set the mode to what it already is"
            was = _reads(mode) if made else mode
            msg = (f"The endpoint sent reasoning in {where}, which this run did not read when {share}{whole} were "
                   f"made (it read {was}); it reads {_reads(now)} now.")
            return msg, "The reading setting is fixed: " + rederive
        msg = (f"The endpoint sends reasoning in {where}; this run reads {_reads(now)}. {share}{whole} have it "
               "there (so their stored reasoning is empty).")
        targets = [f for f in fields if f != now] or ["auto"]
        target = targets[0]
        if target == now:  # no evidence of the field: never propose the value the run already has
            return msg, ("Open the example record to see which raw field holds the reasoning, set reasoning.mode to "
                         "it (Settings & repairs, or `" + _cmd(ctx, "fix", "--reasoning-mode", "FIELD") + "`), then " + rederive)
        other = "" if target == "auto" or now == "auto" else " (or \"auto\")"
        fix = (f"Set reasoning.mode = \"{target}\"{other}: Settings & repairs, or "
               f"`{_cmd(ctx, 'fix', '--reasoning-mode', target)}`. Then " + rederive)
        return msg, fix
    if name == "empty_reasoning":
        return (f"{share}{whole} have no reasoning although the run expects it.",
                "Check where the endpoint puts the reasoning (reasoning.mode), that the server runs a reasoning "
                "parser, and that thinking is enabled (e.g. chat_template_kwargs); set reasoning.expect = false "
                "if this model does not reason.")
    if name == "reasoning_tokens_no_text":
        return (f"{share}{whole}: the server counted reasoning tokens but sent no reasoning text.",
                "The server generates reasoning but does not return it: check include_reasoning / "
                "separate_reasoning on the server and the reasoning.mode of this run.")
    if name == "both_empty_with_tokens":
        return (f"{share}{whole} have neither content nor reasoning although completion_tokens > 0.",
                "The server dropped the text (seen with some vLLM reasoning parsers, vLLM #41902): try another "
                "reasoning parser or server version, or read the reasoning inline (reasoning.mode = \"inline\").")
    if name == "empty_content":
        return (f"{share}{whole} have an empty answer (content).",
                "The model may spend all tokens reasoning or the parser may put the answer in the reasoning: "
                "raise max_tokens, check the reasoning parser and the think tags.")
    if name == "truncated":
        return (f"{share}{whole} stopped at max_tokens (finish_reason = length).",
                "Raise sampling.max_tokens, or keep these records out of training.")
    if name == "truncated_in_reasoning":
        return (f"{share}{whole} were cut off before the reasoning ended: no answer at all.",
                "Raise sampling.max_tokens; these records have no final answer.")
    if name == "think_tags_in_content":
        return (f"{share}{whole} still have think tags inside the content.",
                "The reasoning was not separated: set reasoning.mode = \"inline\" (or \"auto\"), check "
                "reasoning.think_open / think_close and reasoning.prefilled_open.")
    if name == "template_tokens_in_text":
        toks = [str(t)[:40] for t in (ctx.get("tokens") or [])][:3]
        seen = f" (e.g. `{'`, `'.join(toks)}` in the {ctx.get('field') or 'content'})" if toks else ""
        return (f"{share}{whole} have a chat template's control text written as text{seen}.",
                "The server printed special tokens (skip_special_tokens off), a template was applied twice, or the "
                "model ran past its end of turn: check the server's settings and sampling.stop, then re-run these "
                "records (`" + _cmd(ctx, "rerun", "--check", "template_tokens_in_text") + "`) or keep them out of training.")
    if name == "repetition":
        return (f"{share}{whole} end in repeated text (the model looped).",
                "Raise the repetition/presence penalty or temperature, or lower max_tokens; drop these records.")
    if name == "duplicate_output":
        return (f"{share}{whole} repeat the output of an earlier record.",
                "Check that prompts differ, that sampling is not greedy with a fixed seed, and the dataset "
                "for duplicates.")
    if name == "token_count_mismatch":
        d = ctx
        ex = (f" e.g. {d.get('retokenized')} re-tokenized vs {d.get('usage')} reported"
              if d.get("usage") is not None else "")
        return (f"{share} sampled records{whole}: the re-tokenized answer and the server's completion_tokens "
                f"disagree;{ex}.",
                "The configured tokenizer may not be the served model's, or the text was changed on the way; "
                "check tokenizer.name_or_path.")
    if name == "template_drops_reasoning":
        return ("Rendering a record with this run's chat template leaves the reasoning out of the training "
                f"tokens ({ctx.get('template') or 'configured template'}).",
                "Use a chat template that renders reasoning_content for the final assistant turn (or export "
                "with exact token ids); otherwise training loses every chain of thought.")
    if name == "canary_failed":
        why = ctx.get("why") or "the answer was wrong or the reasoning missing"
        return (f"{fail} canary prompts failed{whole}: {why}.",
                "The endpoint or the reasoning capture is not working as expected: open the example record, "
                "compare with a manual request, check reasoning.mode and the model.")
    if name == "server_drift":
        what = ctx.get("field", "system_fingerprint")
        on = f" on endpoint `{ctx['endpoint']}`" if ctx.get("endpoint") else ""
        return (f"The server's {what}{on} changed from `{ctx.get('from')}` to `{ctx.get('to')}` at record "
                f"#{ctx.get('record_id')} (dataset index {ctx.get('idx')}).",
                "A different model or server version answered part of this run; check the endpoints, and "
                "split or re-run the records after the change if that matters.")
    said = f" The server said: {ctx['server_said']}" if ctx.get("server_said") else ""
    if name == "timeout":
        return (f"{share}{whole} finished as timeouts.{said}",
                "The server is overloaded, too slow or not there: check the endpoint's port, lower concurrency, "
                "raise timeouts.total_s / idle_s, or add endpoints.")
    if name == "error":
        return (f"{share}{whole} finished as errors.{said}",
                "Open the latest errors: check the endpoint URL (an OpenAI-compatible base ends in /v1), the "
                "model name (the server's /v1/models lists it), the API key and the server's logs.")
    if ctx.get("why") is not None:  # an extended check (#30): its latest failing verdict's own reason
        why = str(ctx.get("why") or "")
        why = why if len(why) <= SERVER_SAID_CHARS else why[: SERVER_SAID_CHARS - 1] + "…"
        return (f"{share}{whole} failed the {name} check" + (f"; latest: {why}" if why else "") + ".",
                "Open the example record: its verdicts show each check's reason. Fix the prompts or the generation "
                "settings, or change the check (then `" + _cmd(ctx, "checks", "--recompute") + "` checks the run again).")
    return f"{share}{whole} failed the {name} check.", ""
