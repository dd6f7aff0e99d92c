"""Routes: review samples (random viewer), the token view, the records table, and their JSON API (flags:
routes_flags.py).

Pages and their htmx fragments share one data function each (``_viewer_context``, ``_records_context``,
``_tokens_context``, ``flag_context``); fragments are the ``_``-prefixed templates. Model text reaches the
templates only as escaped segments (review.segments), never marked safe.
"""

from __future__ import annotations

import random
import time
from typing import Annotated, Any
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from ..capture import tool_calls
from ..quality import judge_view, selection, verdicts
from ..review import display as review_display
from ..review import filters as review_filters
from ..review import flags as review_flags
from ..review import queries as review
from ..review.filters import Filters, ReviewError
from ..store import queue as store
from ..store.models import LIVE_STATUSES
from . import snippets, token_chips
from .deps import HX, ReadConn, SearchBacklog, render
from .tokenizer_limits import tried_spec

router = APIRouter()

MAX_CHIPS = 50_000  # drawn in blocks laid out as they scroll into view (#28): a 32k-token record shows whole
MAX_TOKEN_VIEW_CHARS = 400_000  # ~100k tokens: a few hundred ms to render


def run_or_404(conn: Any, run_id: int) -> dict[str, Any]:
    try:
        run = store.run_row(conn, run_id)
    except store.NotFound:
        raise HTTPException(404, f"no run with id {run_id} in this database") from None
    try:
        run["config"] = orjson.loads(run.get("config_json") or "{}")
    except orjson.JSONDecodeError:
        run["config"] = {}
    return run


def record_or_404(conn: Any, run_id: int, record_id: int, window: int | None = None) -> dict[str, Any]:
    try:
        return review.get_record(conn, run_id, record_id, window)
    except review_filters.NotFound as exc:
        raise HTTPException(404, str(exc)) from None


def parse_filters(params: Any) -> Filters:
    try:
        return Filters.from_params(params)
    except ReviewError as exc:
        raise HTTPException(400, str(exc)) from None


def bad(exc: Exception) -> HTTPException:
    return HTTPException(400, str(exc))


def _qs(params: dict[str, Any]) -> str:
    clean = {k: v for k, v in params.items() if v not in (None, "")}
    return ("?" + urlencode(clean)) if clean else ""


def _sample_params(request: Request) -> dict[str, str]:
    q = request.query_params
    return {k: q[k] for k in ("mode", "minutes", "check", "s", "t0") if q.get(k)}


def _float_param(request: Request, name: str, default: float) -> float:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise HTTPException(400, f"{name}: not a number: {raw[:40]!r}") from None


def _int_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise HTTPException(400, f"{name}: not a whole number: {raw[:40]!r}") from None


# ------------------------------------------------------------------------------------------- samples


def _pick(request: Request, conn: Any, run_id: int, session: tuple[float, float] | None = None) -> int | None:
    q = request.query_params
    try:
        return review.sample(conn, run_id, q.get("mode") or "all", minutes=_float_param(request, "minutes", 10.0),
                             check=q.get("check") or None, exclude=_int_param(request, "exclude"), session=session)
    except ReviewError as exc:
        raise bad(exc) from None


def _session(request: Request, params: dict[str, str]) -> tuple[float, float] | None:
    """A review session (no record twice): its start in the rnd ring and the rnd of the record shown now.

    The first sample of a mode starts one (s = random start, t0 = when); "recent" samples stay random."""
    if params.get("mode") == "recent":
        return None
    if "s" not in params:
        params["s"], params["t0"] = repr(random.random()), str(int(time.time()))  # floored: rounded up, it left
        # out the session's first verdicts given in the rest of that second (the counter read one short)
    start = _float_param(request, "s", 0.0) if "s" in request.query_params else float(params["s"])
    if not 0.0 <= start < 1.0:
        raise HTTPException(400, "s: a session start between 0 and 1")
    return start, _float_param(request, "at", start)


@router.get("/runs/{run_id}/sample", include_in_schema=False)
def sample_page(request: Request, run_id: int, conn: ReadConn) -> Response:
    run = run_or_404(conn, run_id)
    params = _sample_params(request)
    rid = _pick(request, conn, run_id, _session(request, params))
    if rid is None:
        return render(request, "viewer.html", {
            "run": run, "rec": None, "mode": params.get("mode", "all"), "sample_params": params,
            "modes": review_filters.SAMPLE_MODES, "check_names": [c["name"] for c in check_options(conn, run_id)],
            "session": _session_progress(conn, run, params), "session_done": "s" in request.query_params,
            "restart_url":
                f"/runs/{run_id}/sample{_qs({k: v for k, v in params.items() if k not in ('s', 't0')})}",
        })
    return RedirectResponse(f"/runs/{run_id}/records/{rid}{_qs(params)}", status_code=303)


@router.get("/api/runs/{run_id}/sample", tags=["review"])
def sample_api(request: Request, run_id: int, conn: ReadConn) -> Any:
    """A random record of the run: mode=all|recent|failing|unreviewed|flagged (minutes=, check=, exclude=)."""
    run_or_404(conn, run_id)
    rid = _pick(request, conn, run_id)
    if rid is None:
        return {"record": None}
    return {"record": review.record_json(record_or_404(conn, run_id, rid))}


# -------------------------------------------------------------------------------------------- viewer


def _text_block(value: str | None, ws: bool, more: dict[str, str] | None = None,
                chars: int | None = None) -> dict[str, Any]:
    """A field as the page shows it: its first window only (review.display.VIEW_WINDOW_CHARS, #34), the rest on
    demand (``more``: the next-window fragment and the download of a record's own field). ``chars``: the field's
    full length when ``value`` is already its window (read so by the database)."""
    n = len(value or "") if chars is None else chars
    shown = review_display.window(value) if n > review_display.VIEW_WINDOW_CHARS else value
    segs = review_display.segments(shown or "", whitespace=ws)
    partial = n > len(shown or "")
    return {
        "empty": None if partial else review_display.emptiness(value),
        "segments": segs,
        # a long text in blocks the browser lays out only as they scroll into view (#28 item 8)
        "chunks": review_display.chunks(segs) if len(shown or "") > review_display.TEXT_CHUNK_CHARS else None,
        "chars": n,
        "shown": len(shown or ""),
        "more": more if partial else None,
        "partial": partial,
        "invisible": review_display.count_invisible(shown),
    }


def _more(run_id: int, record_id: int, field: str, at: int) -> dict[str, str]:
    base = f"/runs/{run_id}/records/{record_id}"
    return {"next_url": f"{base}/text/{field}?at={at}", "download_url": f"{base}/download/{field}"}


def _prompt_blocks(prompt_json: str, ws: bool) -> list[dict[str, Any]]:
    try:
        messages = orjson.loads(prompt_json)
    except orjson.JSONDecodeError:
        return [{"role": "raw", **_text_block(prompt_json, ws)}]
    out = []
    if isinstance(messages, dict) and isinstance(messages.get("messages"), list):  # a prompt with tools
        out.append({"role": "tools", **_text_block(_pretty(messages.get("tools")), ws)})
        messages = messages["messages"]
    if not isinstance(messages, list):
        messages = [messages]
    for m in messages:
        if not isinstance(m, dict):
            out.append({"role": "?", **_text_block(str(m), ws)})
            continue
        content = m.get("content", m.get("value"))
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        elif content is not None and not isinstance(content, str):
            content = orjson.dumps(content).decode()
        role = str(m.get("role", m.get("from", "?")))
        if role == "tool" and m.get("name"):
            role = f"tool {m['name']}"
        out.append({"role": role, **_text_block(content, ws)})
        if m.get("tool_calls"):
            out.append({"role": "tool calls", **_text_block(_pretty(tool_calls.pretty(m["tool_calls"])), ws)})
    return out


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _answer_tool_calls(rec: dict[str, Any], ws: bool) -> dict[str, Any] | None:
    """The answer's tool calls (arguments parsed and indented when they are JSON), or None."""
    calls = tool_calls.from_extra_json(rec.get("extra_json"))
    if not calls:
        return None
    try:
        prompt = orjson.loads(rec.get("prompt_json") or "null")
    except orjson.JSONDecodeError:
        prompt = None
    offered = prompt.get("tools") if isinstance(prompt, dict) and isinstance(prompt.get("tools"), list) else None
    return {"n": len(calls), "problems": tool_calls.problems(calls, offered),
            **_text_block(_pretty(tool_calls.pretty(calls)), ws)}


def _last_turn_prompt(run: dict[str, Any], rec: dict[str, Any]) -> str:
    """The prompt of the record's last turn: with earlier turns (synthwatch.capture.turns), the history its request
    carried, the model's own answers in place of the dataset's."""
    from ..capture import turns as turns_mod

    done = turns_mod.load(rec.get("turns_json"))
    if not done:
        return str(rec["prompt_json"])
    try:
        prompt = orjson.loads(rec["prompt_json"])
        hist = turns_mod.history(prompt, done, len(done), turns_mod.history_reasoning_of(run.get("config_json")))
    except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError):
        return str(rec["prompt_json"])
    return orjson.dumps(hist).decode()


def _turn_blocks(rec: dict[str, Any], ws: bool) -> list[dict[str, Any]]:
    """The conversation's finished turns before the last (the last is the record's own answer)."""
    from ..capture import turns as turns_mod

    try:
        det = orjson.loads(rec.get("check_json") or "{}")
    except orjson.JSONDecodeError:
        det = {}
    failing: dict[str, Any] = {}
    if isinstance(det, dict) and isinstance(det.get("turns"), dict):
        failing = det["turns"]
    out = []
    for i, t in enumerate(turns_mod.load(rec.get("turns_json"))):
        out.append({
            "n": i + 1, "reasoning": _text_block(t.get("reasoning"), ws), "content": _text_block(t.get("content"), ws),
            "tool_calls": _answer_tool_calls({**t, "prompt_json": rec.get("prompt_json")}, ws),
            "attempts": len(t.get("attempts") or ()), "finish_reason": t.get("finish_reason"),
            "failed": sorted(failing.get(str(i + 1)) or ()),
        })
    return out


def _extended_verdicts(conn: Any, run: dict[str, Any], rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The extended checks' verdicts in force on this record (#30), with 'pending' for a configured check that has
    not answered yet (an ok record only: the checks judge answers)."""
    got = {v.check_name: v for v in verdicts.record_verdicts(conn, rec["id"])}
    names = verdicts.configured_checks(run.get("config_json")) if rec.get("status") == "ok" else []
    out = []
    for name in [*names, *sorted(n for n in got if n not in names)]:
        v = got.get(name)
        out.append({"name": name, "state": v.state if v else "pending",
                    "label": v.verdict.label if v else None, "reason": v.verdict.reason if v else None,
                    "score": v.verdict.score if v else None, "cost_ms": v.cost_ms if v else None})
    return out


def flag_context(conn: Any, run: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    return {"run": run, "rec": rec, "flags": review.flag_history(conn, rec["id"]), "reasons": review_filters.REASONS,
            "reason_labels": review_filters.REASON_LABELS, "judge": judge_view.record_verdict(conn, rec["id"])}


def _viewer_context(request: Request, conn: Any, run: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    ws = False  # whitespace is made visible in the browser (review.js), without a reload
    params = _sample_params(request)
    f = parse_filters(request.query_params)
    in_set = f.active or "sort" in request.query_params or request.query_params.get("from") == "records"
    prev_id = next_id = None
    if in_set:
        try:
            prev_id, next_id = review.neighbours(conn, run["id"], f, rec)
        except ReviewError as exc:
            raise bad(exc) from None
    filter_qs = _qs({**f.params(), "from": "records"})
    sample_qs = _qs({**params, "exclude": rec["id"], "at": repr(rec["rnd"]) if "s" in params else None})
    attempts: list[Any] = []
    if rec.get("attempts_json"):
        try:
            attempts = orjson.loads(rec["attempts_json"])
        except orjson.JSONDecodeError:
            attempts = []
    return {
        **flag_context(conn, run, rec),
        "ws": ws,
        "mode": params.get("mode", "all"),
        "sample_params": params,
        "modes": review_filters.SAMPLE_MODES,
        "check_names": [c["name"] for c in check_options(conn, run["id"])],
        "prompt": _prompt_blocks(_last_turn_prompt(run, rec), ws),
        "turns": _turn_blocks(rec, ws),
        "reasoning": _text_block(rec["reasoning"], ws,
                                 _more(run["id"], rec["id"], "reasoning", review_display.VIEW_WINDOW_CHARS),
                                 rec.get("reasoning_chars")),
        "content": _text_block(rec["content"], ws,
                               _more(run["id"], rec["id"], "content", review_display.VIEW_WINDOW_CHARS),
                               rec.get("content_chars")),
        "tool_calls": _answer_tool_calls(rec, ws),
        "failed": review_filters.failed_checks(rec["check_flags"]),
        "verdicts": _extended_verdicts(conn, run, rec),
        "attempt_list": attempts if isinstance(attempts, list) else [],
        "raw": review_display.window(raw := review.raw_fields(
            {k: v for k, v in rec.items() if k not in ("reasoning_chars", "content_chars")})),  # its first window
        "raw_chars": len(raw),
        "json_url": f"/api/runs/{run['id']}/records/{rec['id']}",
        "window_chars": review_display.VIEW_WINDOW_CHARS,
        "in_set": in_set,
        "prev_url": f"/runs/{run['id']}/records/{prev_id}{filter_qs}" if prev_id else None,
        "next_url": f"/runs/{run['id']}/records/{next_id}{filter_qs}" if next_id else None,
        "records_url": f"/runs/{run['id']}/records{_qs(f.params())}",
        "sample_url": f"/runs/{run['id']}/sample{sample_qs}",
        "tokens_url": f"/runs/{run['id']}/records/{rec['id']}/tokens",
        "history": _history(conn, rec["id"]),
        "session": _session_progress(conn, run, params),
    }


def _session_progress(conn: Any, run: dict[str, Any], params: dict[str, str]) -> dict[str, int] | None:
    if "t0" not in params:
        return None
    try:
        t0 = float(params["t0"])
    except ValueError:
        return None
    return {"reviewed": review.reviewed_since(conn, run["id"], t0), "unreviewed": review.unreviewed_ok(conn, run),
            "n_ok": int(run["n_ok"])}


def _history(conn: Any, record_id: int) -> list[dict[str, Any]]:
    from ..repair.history import history

    out = []
    for h in history(conn, record_id):
        h["failed"] = review_filters.failed_checks(h["check_flags"])
        try:
            h["attempt_list"] = orjson.loads(h["attempts_json"]) if h["attempts_json"] else []
        except orjson.JSONDecodeError:
            h["attempt_list"] = []
        out.append(h)
    return out


@router.get("/runs/{run_id}/records/{record_id:int}", include_in_schema=False)
def viewer_page(request: Request, run_id: int, record_id: int, conn: ReadConn) -> Response:
    run = run_or_404(conn, run_id)
    rec = record_or_404(conn, run_id, record_id, review_display.VIEW_WINDOW_CHARS)
    response = render(request, "viewer.html", _viewer_context(request, conn, run, rec))
    response.headers["Cache-Control"] = "no-store"  # Back shows the verdict as it is now, not a cached page
    return response


@router.get("/api/runs/{run_id}/records/{record_id:int}", tags=["review"])
def record_api(run_id: int, record_id: int, conn: ReadConn) -> Any:
    """One record with its JSON columns decoded and its flag history."""
    run_or_404(conn, run_id)
    rec = record_or_404(conn, run_id, record_id)
    from ..repair.history import history

    return {"record": review.record_json(rec), "flags": review.flag_history(conn, record_id),
            "history": history(conn, record_id)}


# ------------------------------------------------------------------------------------------- records


def check_options(conn: Any, run_id: int) -> list[dict[str, str]]:
    """Every check the run knows (its catalogue: built-in, verifiers, rules, user checks, language, near-duplicates,
    the judge, and names with verdicts stored), for the pickers of the records filter and the repair page."""
    from .words import check_label

    cat = selection.catalogue(conn, run_id)
    return [{"name": e.name, "kind": e.kind, "info": e.info,
             "label": check_label(e.name) if e.kind == selection.BUILTIN else e.name}
            for e in cat.entries.values()]


def _records_context(request: Request, conn: Any, run: dict[str, Any], backlog: int) -> dict[str, Any]:
    """The records page and its table fragment. A filter that cannot be used (an unknown check, an expression
    with an error) is the table's message, with the form as typed, never a 500."""
    q = request.query_params
    f = parse_filters(q)
    error = None
    try:
        pg = review.page(conn, run["id"], f, after=q.get("after") or None, before=q.get("before") or None)
    except ReviewError as exc:
        conn.rollback()
        error, pg = str(exc), review.Page([], None, None, f)
    base = f.params()
    found = snippets.for_rows(conn, [r["id"] for r in pg.rows], f.q, f.field) if f.q else {}
    return {
        "run": run, "f": f, "page": pg, "snippets": found, "fq": _qs({**base, "from": "records"}),
        "filter_error": error, "where_max": selection.WHERE_MAX_CHARS,
        "next_url": f"/runs/{run['id']}/records{_qs({**base, 'after': pg.next_cursor})}" if pg.next_cursor else None,
        "prev_url": f"/runs/{run['id']}/records{_qs({**base, 'before': pg.prev_cursor})}" if pg.prev_cursor else None,
        "count_url": f"/runs/{run['id']}/records/count{_qs(base)}",
        "statuses": review_filters.STATUS_FILTERS, "flags": review_filters.FLAG_FILTERS, "reasons": review_filters.REASONS,
        "sorts": review_filters.SORTS, "fields": review_filters.SEARCH_FIELDS,
        "check_options": check_options(conn, run["id"]),
        "finish_reasons": review.distinct_values(conn, run["id"], "finish_reason"),
        "endpoints": review.distinct_values(conn, run["id"], "endpoint"),
        "sources": review.distinct_values(conn, run["id"], "reasoning_source"),
        "search_ok": conn.dialect.name in ("sqlite", "postgresql"),
        "search_backlog": backlog, "table_url": f"/runs/{run['id']}/records{_qs(base)}",
        "follow": run["status"] in LIVE_STATUSES and not (q.get("after") or q.get("before")),
    }


@router.get("/runs/{run_id}/records", include_in_schema=False)
def records_page(request: Request, run_id: int, backlog: SearchBacklog, conn: ReadConn, hx: HX) -> Response:
    run = run_or_404(conn, run_id)
    if not request.query_params and not hx:  # the default view: finished records, newest first (any: status=)
        return RedirectResponse(f"/runs/{run_id}/records?status={review_filters.FINISHED}", status_code=303)
    ctx = _records_context(request, conn, run, backlog)
    status = 400 if ctx["filter_error"] else 200
    if hx and request.headers.get("HX-Target") == "records-table":
        return render(request, "_records_table.html", ctx, status_code=status)
    ctx["last_bulk"] = review_flags.latest_bulk(conn, run_id)
    return render(request, "records.html", ctx, status_code=status)


@router.get("/runs/{run_id}/records/count", include_in_schema=False)
def records_count_fragment(request: Request, run_id: int, backlog: SearchBacklog, conn: ReadConn) -> Response:
    run = run_or_404(conn, run_id)
    f = parse_filters(request.query_params)
    try:
        n, capped = review.count(conn, run_id, f)
    except ReviewError as exc:
        raise bad(exc) from None
    return render(request, "_records_count.html", {"run": run, "n": n, "capped": capped, "search_backlog": backlog})


CHECK_HELP = ("Records failing this check: any name of the run's catalogue (a built-in check such as `truncated`, "
              "a verifier `verify_math` or `verify:math`, a rule `rule:NAME`, a user check `user:NAME`, `language`, "
              "`near_duplicate`, `judge`), or `any` (failing any check of the run: a built-in bit or a latest verdict of fail) / `none` (failing none). An unknown name is a 400 "
              "that names the closest known one (did you mean).")
WHERE_HELP = ("A selection expression over the run's checks, e.g. `verify:math=pass and language=pass and not "
              "near_duplicate`: `NAME=OUTCOME` (pass, fail, error, pending; a built-in check is pass or fail), "
              "`NAME!=OUTCOME`, a bare `NAME` (= `NAME=fail`), combined with `and`, `or`, `not` and parentheses "
              "(`not` binds tightest, then `and`, then `or`). The same grammar as the export command's `--where` and "
              "bulk actions (docs/samples.md). A mistake is a 400 naming its column and the check meant.")
CheckParam = Annotated[str | None, Query(description=CHECK_HELP, max_length=review_filters.CHECK_NAME_MAX)]
WhereParam = Annotated[str | None, Query(description=WHERE_HELP)]


@router.get("/api/runs/{run_id}/records", tags=["review"])
def records_api(request: Request, run_id: int, backlog: SearchBacklog, conn: ReadConn, check: CheckParam = None,
                where: WhereParam = None) -> Any:
    """A page of records (filters: status, check, where, flag, reason, finish_reason, endpoint, reasoning_source,
    reasoning_len_min/max, content_len_min/max, completion_tokens_min/max, q (+ field), sort, order; pagination:
    after / before cursors, limit). `check` and `where` name any check of the run (built-in, verifier, rule, user,
    language, near-duplicate, judge); a bad one is a 400 whose detail names the problem. With `q` on SQLite,
    `search_backlog` counts finished records not yet in the search index (0 normally; see docs/review.md)."""
    run_or_404(conn, run_id)
    q = request.query_params
    f = parse_filters(q)
    try:
        pg = review.page(conn, run_id, f, after=q.get("after") or None, before=q.get("before") or None,
                         limit=_int_param(request, "limit") or review_filters.PAGE_SIZE)
    except ReviewError as exc:
        raise bad(exc) from None
    return {"records": pg.rows, "next_cursor": pg.next_cursor, "prev_cursor": pg.prev_cursor,
            "filters": f.params(), "elapsed_ms": round(pg.elapsed_ms, 2), "search_backlog": backlog}


@router.get("/api/runs/{run_id}/records/count", tags=["review"])
def records_count_api(request: Request, run_id: int, backlog: SearchBacklog, conn: ReadConn, check: CheckParam = None,
                      where: WhereParam = None) -> Any:
    """How many records match the filters (the records listing's, `check` and `where` included; stops counting at
    100,000: capped=true)."""
    run_or_404(conn, run_id)
    f = parse_filters(request.query_params)
    try:
        n, capped = review.count(conn, run_id, f)
    except ReviewError as exc:
        raise bad(exc) from None
    return {"count": n, "capped": capped, "search_backlog": backlog}


# -------------------------------------------------------------------------------------------- tokens


def _tokens_context(request: Request, conn: Any, run: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    from ..tokens import render as tokens_render  # transformers is heavy: imported on first use
    from ..tokens import tokenizer as tokens

    cfg = run.get("config") or {}
    tk = cfg.get("tokenizer") or {}
    rs = cfg.get("reasoning") or {}
    q = request.query_params
    tried = (q.get("tokenizer") or "").strip()
    tried_template = (q.get("chat_template") or "").strip() or None
    ctx: dict[str, Any] = {"run": run, "rec": rec, "configured": bool(tk.get("name_or_path")), "tried": tried,
                           "tried_template": tried_template or "", "error": None, "r": None,
                           "tokens_url": f"/runs/{run['id']}/records/{rec['id']}/tokens"}
    if tried:  # within the dashboard's tokenizer folders, never running its code
        spec = tried_spec(request, tried, tried_template, rs)
        if isinstance(spec, str):
            ctx["error"] = spec
            return ctx
    elif tk.get("name_or_path"):
        spec = tokens.TokenizerSpec(str(tk["name_or_path"]), chat_template=tk.get("chat_template") or None,
                                    trust_remote_code=bool(tk.get("trust_remote_code")),
                                    think_open=rs.get("think_open") or "<think>",
                                    think_close=rs.get("think_close") or "</think>")
    else:
        return ctx
    ctx["spec"] = spec
    ids: dict[str, Any] = {}
    if rec.get("token_ids_json"):
        try:
            ids = orjson.loads(rec["token_ids_json"]) or {}
        except orjson.JSONDecodeError:
            ids = {}
    size = (len(rec.get("prompt_json") or "") + rec.get("reasoning_chars", len(rec.get("reasoning") or ""))
            + rec.get("content_chars", len(rec.get("content") or "")))
    if size > MAX_TOKEN_VIEW_CHARS:
        # tokenizing megabytes of model output on every request would tie up the dashboard for seconds
        ctx["error"] = (f"this record holds {size:,} characters; the token view renders records up to "
                        f"{MAX_TOKEN_VIEW_CHARS:,} characters (export it with --format tokens to inspect it)")
        return ctx
    try:
        messages = orjson.loads(rec["prompt_json"])
        lt = tokens.load_tokenizer(spec)
        r = tokens_render.render_record(
            lt, messages, rec.get("reasoning") or "", rec.get("content") or "",
            usage_completion_tokens=rec.get("completion_tokens"),
            server_prompt_ids=ids.get("prompt"), server_completion_ids=ids.get("completion"),
            finish_reason=rec.get("finish_reason"),
        )
    except tokens.TokenizerError as exc:
        ctx["error"] = str(exc)
        return ctx
    except orjson.JSONDecodeError as exc:
        ctx["error"] = f"the record's prompt is not valid JSON: {exc}"
        return ctx
    show_all = q.get("all") == "1"
    shown = r.chips if show_all else r.chips[:MAX_CHIPS]
    views, outline = token_chips.chip_views(lt, shown, token_chips.logprob_hovers(lt, rec, shown, r.prompt_len))
    ctx.update({
        "r": r, "lt": lt, "chunks": token_chips.chunked(views), "outline": outline,
        "hidden_chips": len(r.chips) - len(shown),
        "server_ids": ids, "all_url": f"/runs/{run['id']}/records/{rec['id']}/tokens{_qs({**dict(q), 'all': '1'})}",
    })
    return ctx


@router.get("/runs/{run_id}/records/{record_id:int}/tokens", include_in_schema=False)
def tokens_page(request: Request, run_id: int, record_id: int, conn: ReadConn, hx: HX) -> Response:
    run = run_or_404(conn, run_id)
    rec = record_or_404(conn, run_id, record_id, MAX_TOKEN_VIEW_CHARS)  # a longer record is not drawn (#34)
    ctx = _tokens_context(request, conn, run, rec)
    return render(request, "_tokens.html" if hx else "tokens.html", ctx)


@router.get("/api/runs/{run_id}/records/{record_id:int}/tokens", tags=["review"])
def tokens_api(request: Request, run_id: int, record_id: int, conn: ReadConn) -> Any:
    """The record as training sees it: chips (id, text, piece, raw_bytes, kind, in_assistant, differs), totals,
    loss mask and integrity warnings; tokenizer from the run's config (or ?tokenizer=NAME_OR_PATH)."""
    run = run_or_404(conn, run_id)
    rec = record_or_404(conn, run_id, record_id, MAX_TOKEN_VIEW_CHARS)  # a longer record is not drawn (#34)
    ctx = _tokens_context(request, conn, run, rec)
    if ctx["r"] is None:
        detail = ctx["error"] or ("this run has no tokenizer configured: set [tokenizer] name_or_path in the run "
                                  "config, or pass ?tokenizer=NAME_OR_PATH")
        return JSONResponse({"detail": detail}, status_code=400 if ctx["error"] else 409)
    return ctx["r"].as_dict()
