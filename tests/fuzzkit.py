"""Hypothesis strategies for what an OpenAI-compatible server can send, and the server that sends it.

One strategy, :func:`wires`, draws a whole reply as it goes on the wire (:class:`Wire`): its status line and
headers, its body (a ``chat.completion`` or a stream of ``chat.completion.chunk`` events, valid or not, of any
shape), the framing (chunked, Content-Length, close-delimited, gzip/deflate with headers that may lie, cut short),
and the timing (pieces written with pauses, a stall). It is composed from small strategies (a value, a chunk, an
event, a body, a framing) so that a shrunk failure reads as the smallest reply that still breaks something.

A :class:`Wire` is plain data: :meth:`Wire.to_json` / :meth:`Wire.from_json` write it as a JSON file
(tests/fuzz_regressions/) that a plain test replays on every run. :func:`serve` turns it into a
:class:`tests.hostileserver.HostileServer` reply.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import Phase
from hypothesis import strategies as st

from tests.hostile import HOSTILE
from tests.hostileserver import Reply, head

MiB = 2**20
REGRESSIONS = Path(__file__).resolve().parent / "fuzz_regressions"
PROFILE = os.environ.get("SYNTHWATCH_HYPOTHESIS_PROFILE", "ci")


# no "explain" phase: it re-runs a failing example many times under a tracer, which costs minutes when an example
# runs a worker, and its tracer saw the worker's threads
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
FUZZ_SECONDS = float(os.environ.get("SYNTHWATCH_FUZZ_SECONDS", "0") or 0)  # ./dev fuzz: a test file's time budget


def examples(ci: int) -> int:
    """A suite's example count: ``ci`` under the bounded "ci" profile (all suites share CI's time budget, see
    docs/testing.md); under "fuzz" SYNTHWATCH_FUZZ_EXAMPLES, or until ./dev fuzz's time budget ends (see
    :func:`spend`), or ten times the CI count."""
    if PROFILE == "ci":
        return ci
    if os.environ.get("SYNTHWATCH_FUZZ_EXAMPLES"):
        return int(os.environ["SYNTHWATCH_FUZZ_EXAMPLES"])
    return 1_000_000 if FUZZ_SECONDS else max(ci * 10, 200)


_ran: dict[str, int] = {}
_started: dict[str, float] = {}
_failing: set[str] = set()


def spend(test: str, share: float = 1.0) -> None:
    """Called at the start of each example. Under ./dev fuzz a test has ``share`` of its file's time budget
    (SYNTHWATCH_FUZZ_SECONDS) from its first example on; once that is spent the test ends (reported as skipped, with
    the number of examples that ran) unless it has found a failure, which Hypothesis then shrinks."""
    import pytest

    n = _ran[test] = _ran.get(test, 0) + 1
    start = _started.setdefault(test, time.monotonic())
    if FUZZ_SECONDS and time.monotonic() > start + FUZZ_SECONDS * share and test not in _failing:
        pytest.skip(f"fuzz time budget spent: {n - 1} examples ran in {time.monotonic() - start:.0f} s, none failed")


# ------------------------------------------------------------------------------------- JSON values with raw parts


@dataclass(frozen=True)
class Raw:
    """Bytes put into the JSON text as they are: tokens JSON has no value for (NaN, Infinity), nesting deeper than
    a Python encoder goes, invalid UTF-8, a lone surrogate escape."""

    data: bytes

    def __repr__(self) -> str:  # a shrunk example stays readable: Raw(b'[[[...]]]' x 1000) instead of 2 KB
        d = self.data
        if len(d) > 60:
            return f"Raw({d[:24]!r}...{d[-12:]!r} ({len(d):,} bytes))"
        return f"Raw({d!r})"


def dump(v: Any, ascii_only: bool = False) -> bytes:
    """JSON text of ``v``; :class:`Raw` parts go in verbatim, floats NaN/inf as the (invalid) tokens Python writes."""
    if isinstance(v, Raw):
        return v.data
    if isinstance(v, dict):
        return b"{" + b",".join(dump(str(k), ascii_only) + b":" + dump(x, ascii_only) for k, x in v.items()) + b"}"
    if isinstance(v, list | tuple):
        return b"[" + b",".join(dump(x, ascii_only) for x in v) + b"]"
    # json.dumps writes NaN / Infinity for those floats: invalid JSON, which servers (Python ones) really send
    return json.dumps(v, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def _nested(depth: int, kind: str) -> Raw:
    if kind == "list":
        return Raw(b"[" * depth + b"1" + b"]" * depth)
    return Raw(b'{"a":' * depth + b"1" + b"}" * depth)


# integers around every width a count may be stored in, and the ones JSON parsers disagree about
HUGE_INTS = [2**31 - 1, 2**31, 3_000_000_000, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30,
             -1, -(2**31), -(2**63), -(2**63) - 1, -(10**30)]
RAW_TOKENS = [Raw(b"NaN"), Raw(b"Infinity"), Raw(b"-Infinity"), Raw(b"1e400"), Raw(b"-0"), Raw(b"1.0e-400"),
              Raw(b"01"), Raw(b"true1"), Raw(b'"\\ud800"'), Raw(b'"\\udfff x"'), Raw(b'"\xff\xfe"'),
              Raw(b'"\xc0\xaf"'), Raw(b'"\xed\xa0\x80"'), Raw(b"")]

ints = st.one_of(st.integers(0, 10**6), st.sampled_from(HUGE_INTS), st.integers())
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1e308, -0.0, 5.0]))
short_text = st.text(max_size=30)
control_text = st.text(st.characters(max_codepoint=0x1F), min_size=1, max_size=10).map(lambda s: "a" + s + "b")
nasty_text = st.one_of(
    short_text,
    control_text,
    st.sampled_from(HOSTILE),
    st.sampled_from(["\x00", "a\x00b", "\u2028", "\ufeff", "\U0010ffff"]),
    st.integers(1, 300_000).map(lambda n: "x" * n),  # long, past a page's and a column's comfort
)
# nesting that orjson parses (it refuses more than 1,024 levels) but that is deeper than it writes (254)
deep = st.builds(_nested, st.sampled_from([2, 64, 254, 255, 256, 500, 1000, 1023]), st.sampled_from(["list", "dict"]))
too_deep = st.builds(_nested, st.sampled_from([1024, 1025, 5000, 100_000]), st.sampled_from(["list", "dict"]))
raw_tokens = st.one_of(st.sampled_from(RAW_TOKENS), too_deep)
# valid JSON values of any shape and size
scalars = st.one_of(st.none(), st.booleans(), ints, floats, nasty_text, deep)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(short_text, inner, max_size=4), max_leaves=8)
# what JSON has no value for, or is not text at all
broken = st.recursive(raw_tokens, lambda inner: st.lists(st.one_of(values, inner), min_size=1, max_size=3)
                      | st.dictionaries(short_text, inner, min_size=1, max_size=2), max_leaves=3)


def often(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], k: int = 3) -> st.SearchStrategy[Any]:
    """Mostly ``good`` (k to 1), else ``bad``: a reply holds a few bad values among good ones, not only bad ones.
    A failure shrinks towards the good value."""
    which = st.integers(0, k)

    @st.composite
    def pick(draw: Any) -> Any:
        return draw(good) if draw(which) < k else draw(bad)

    return pick()


def good_or(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any] | None = None) -> st.SearchStrategy[Any]:
    """A field's value: the good one, or any JSON value, or (rarely) something JSON cannot hold."""
    return often(good, bad if bad is not None else often(values, broken, 20))


def _optional(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object whose usual fields are mostly there (any may be missing), whose optional ones come half the time,
    and which sometimes brings unknown ones. Shrinks towards the usual fields only."""
    extra = st.dictionaries(st.sampled_from(["x_extra", "metadata", "error", "object", "choices", "usage"]),
                            often(values, deep, 2), min_size=1, max_size=2)

    present = often(st.just(True), st.just(False), 5)
    extras = often(st.just({}), extra, 4)

    @st.composite
    def obj(draw: Any) -> dict[str, Any]:
        out = dict(draw(extras))
        for k, strategy in required.items():
            if draw(present):
                out[k] = draw(strategy)
        for k, strategy in optional.items():
            if draw(st.booleans()):
                out[k] = draw(strategy)
        return out

    return obj()


counts = often(st.integers(0, 5000), often(st.sampled_from(HUGE_INTS), values, 2), 2)
usage = _optional({"prompt_tokens": counts, "completion_tokens": counts, "total_tokens": counts},
                  {"completion_tokens_details": good_or(st.fixed_dictionaries({"reasoning_tokens": counts}))})
text_or_bad = good_or(short_text, st.one_of(nasty_text, values))
finish = good_or(st.sampled_from(["stop", "length", "tool_calls"]), st.one_of(st.none(), nasty_text, values))
delta = _optional({"role": good_or(st.just("assistant")), "content": text_or_bad, "reasoning": text_or_bad},
                  {"reasoning_content": text_or_bad, "thinking": text_or_bad,
                   "reasoning_details": good_or(st.lists(st.fixed_dictionaries(
                       {"type": st.just("reasoning.text"), "text": text_or_bad}), max_size=2)),
                   "tool_calls": good_or(st.lists(st.fixed_dictionaries(
                       {"index": ints, "id": text_or_bad, "function": st.fixed_dictionaries(
                           {"name": text_or_bad, "arguments": text_or_bad})}), max_size=2))})
stream_choice = _optional({"index": good_or(st.just(0), st.one_of(ints, values)), "delta": good_or(delta),
                           "finish_reason": finish},
                          {"token_ids": good_or(st.lists(ints, max_size=5)), "logprobs": values})
chunk_obj = _optional({"id": text_or_bad, "object": good_or(st.just("chat.completion.chunk")),
                       "created": ints, "model": text_or_bad,
                       "choices": good_or(st.lists(good_or(stream_choice), min_size=1, max_size=2))},
                      {"usage": good_or(usage), "system_fingerprint": text_or_bad,
                       "prompt_token_ids": good_or(st.lists(ints, max_size=5))})
message = _optional({"role": good_or(st.just("assistant")), "content": text_or_bad, "reasoning": text_or_bad},
                    {"reasoning_content": text_or_bad, "thinking": text_or_bad, "tool_calls": values})
whole_choice = _optional({"index": good_or(st.just(0), ints), "message": good_or(message), "finish_reason": finish},
                         {"token_ids": good_or(st.lists(ints, max_size=5)), "logprobs": values})
completion_obj = _optional({"id": text_or_bad, "object": good_or(st.just("chat.completion")), "created": ints,
                            "model": text_or_bad, "choices": good_or(st.lists(good_or(whole_choice), min_size=1,
                                                                               max_size=2)),
                            "usage": good_or(usage)},
                           {"system_fingerprint": text_or_bad, "prompt_token_ids": good_or(st.lists(ints, max_size=5))})

GOOD_CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "sim-reasoner",
              "choices": [{"index": 0, "delta": {"content": "The answer."}, "finish_reason": None}]}
FINISH_CHUNK = {**GOOD_CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


# ------------------------------------------------------------------------------------------------- SSE events


@dataclass(frozen=True)
class Event:
    """One SSE event: its data payload and how it is framed."""

    payload: Any  # a JSON value (dumped), or Raw bytes ([DONE], garbage)
    prefix: bytes = b"data: "
    eol: bytes = b"\n"
    before: bytes = b""  # a comment or another field line first
    ascii_only: bool = False

    def encode(self) -> bytes:
        return self.before + self.prefix + dump(self.payload, self.ascii_only) + self.eol + self.eol


DONE = Raw(b"[DONE]")
garbage = st.sampled_from([Raw(b"not json"), Raw(b"{"), Raw(b"[]"), Raw(b"null"), Raw(b'"DONE"'), Raw(b"[DONE] "),
                           Raw(b'{"error":{"message":"overloaded","code":503}}'), Raw(b'{"choices":[1,"two",null]}')])
# an event's data: mostly a chunk (so that a stream gets far enough for its values to reach the store)
payloads = often(chunk_obj, st.one_of(st.just(DONE), garbage, values, broken), 8)
events = st.builds(Event, payloads, st.sampled_from([b"data: ", b"data:", b"data:  "]),
                   st.sampled_from([b"\n", b"\r\n", b"\r"]),
                   st.sampled_from([b"", b": keep-alive\n", b"event: message\n", b"id: 7\n", b"retry: 10\n",
                                    b":\n\n", b"\xef\xbb\xbf"]),
                   st.booleans())
ENDINGS = {  # how a stream ends
    "finish+done": [Event(FINISH_CHUNK), Event(DONE)],
    "done": [Event(DONE)],
    "finish": [Event(FINISH_CHUNK)],
    "nothing": [],
    "done-then-more": [Event(DONE), Event(GOOD_CHUNK), Event(DONE)],
}


def stream_body(evs: list[Event], ending: str, repeat: int) -> bytes:
    return b"".join(e.encode() for e in evs) * repeat + b"".join(e.encode() for e in ENDINGS[ending])


# ------------------------------------------------------------------------------------------------- the wire


@dataclass(frozen=True)
class Wire:
    """One reply as a server sends it. Plain data: written to and read from JSON as it is."""

    stream: bool  # the run asks for a stream ("stream": true in the request)
    body: bytes  # the reply body before any content coding
    status: int = 200
    ctype: str = "text/event-stream"
    coding: str = ""  # the content coding applied to the body: "", "gzip", "deflate"
    coding_header: str = ""  # what Content-Encoding says (it may lie)
    framing: str = "chunked"  # chunked | length | close | length-short | length-long
    pieces: tuple[int, ...] = ()  # the body is written in pieces cut at these offsets
    pause_s: float = 0.0  # between pieces
    stall_s: float = 0.0  # silence before the last piece
    cut: int | None = None  # the connection closes after this many bytes of the (framed) body
    extra_headers: tuple[str, ...] = ()
    note: str = field(default="", compare=False)

    def wire_body(self) -> bytes:
        if self.coding == "gzip":
            return gzip.compress(self.body, mtime=0)
        if self.coding == "deflate":
            return zlib.compress(self.body)
        return self.body

    def head_and_body(self) -> tuple[bytes, bytes]:
        body = self.wire_body()
        extra = list(self.extra_headers)
        if self.coding_header:
            extra.append(f"Content-Encoding: {self.coding_header}")
        status = f"{self.status} X"
        if self.framing == "chunked":
            cuts = [0, *sorted({c % (len(body) + 1) for c in self.pieces} - {0}), len(body)]
            parts = [body[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
            framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
            return head(status, self.ctype, *extra, chunked=True), framed
        if self.framing == "close":
            return head(status, self.ctype, *extra, "Connection: close", chunked=False), body
        length = len(body) + {"length": 0, "length-short": -min(len(body), 7), "length-long": 50}[self.framing]
        return head(status, self.ctype, *extra, length=length), body

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["body"] = self.body.decode("latin-1")  # every byte as one code point: exact and readable
        d["pieces"] = list(self.pieces)
        d["extra_headers"] = list(self.extra_headers)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Wire:
        return cls(**{**d, "body": d["body"].encode("latin-1"), "pieces": tuple(d.get("pieces", ())),
                      "extra_headers": tuple(d.get("extra_headers", ()))})

    def __repr__(self) -> str:  # what Hypothesis prints for a falsifying example
        body = self.body if len(self.body) <= 400 else self.body[:300] + b"..." + self.body[-60:]
        rest = {k: v for k, v in asdict(self).items() if k not in ("body", "note") and v != Wire.__dataclass_fields__[
            k].default}
        return f"Wire(body={body!r} ({len(self.body):,} bytes), {rest})"


def _pieces(n_max: int = 12) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(0, 1 << 20), max_size=n_max).map(tuple)


timing = often(st.just({}), st.fixed_dictionaries({}, optional={
    "pieces": _pieces(), "pause_s": st.sampled_from([0.0, 0.01, 0.05, 0.2]),
    "stall_s": st.sampled_from([0.0, 0.3, 1.5]),  # 1.5 s: longer than the suites' idle timeout of 1 s
}), 2)
honest_framing = st.builds(lambda f, c: {"framing": f, "coding": c, "coding_header": c},
                           st.sampled_from(["chunked", "length", "close"]), st.sampled_from(["", "", "gzip", "deflate"]))
lying_framing = st.fixed_dictionaries({}, optional={
    "framing": st.sampled_from(["chunked", "length", "close", "length-short", "length-long"]),
    "coding": st.sampled_from(["", "gzip", "deflate"]),
    "coding_header": st.sampled_from(["", "gzip", "deflate", "br", "identity", "gzip, gzip"]),
    "cut": st.one_of(st.none(), st.integers(0, 4096)),
    "extra_headers": st.lists(st.sampled_from(["X-Junk: 1", "Content-Type: application/json", "Retry-After: 1",
                                               "Transfer-Encoding: identity", "Content-Length: 3"]),
                              max_size=2).map(tuple),
})
framing = often(honest_framing, lying_framing, 3)
MAX_BODY = 8 * MiB  # a repeated stream stops growing here (the suites' memory bound is stated against it)


_events = st.lists(events, max_size=6)
_asked = {b: often(st.just(b), st.just(not b), 5) for b in (True, False)}  # mostly what was asked for
_ending = often(st.just("finish+done"), st.sampled_from(list(ENDINGS)), 2)
_repeat = st.sampled_from([1, 1, 1, 2, 50, 1000])
_ctype = {c: often(st.just(c), st.sampled_from(["text/event-stream; charset=latin-1", "application/json; charset=utf-16",
                                                "text/html", ""]), 6) for c in ("text/event-stream", "application/json")}
_status = often(st.just(200), st.sampled_from([201, 204, 400, 429, 500, 503]), 8)
_doc = often(completion_obj, payloads, 4)


@st.composite
def wires(draw: Any) -> Wire:
    """A reply: streamed or whole, valid or not, framed and timed any way."""
    stream = draw(st.booleans())
    sse = draw(_asked[stream])
    if sse:
        evs = draw(_events)
        ending = draw(_ending)
        once = len(stream_body(evs, "nothing", 1)) or 1
        body = stream_body(evs, ending, min(draw(_repeat), max(1, MAX_BODY // once)))
        ctype = "text/event-stream"
    else:
        doc = draw(_doc)
        body = dump(doc, draw(st.booleans()))
        ctype = "application/json"
    ctype = draw(_ctype[ctype])
    status = draw(_status)
    return Wire(stream=stream, body=body, status=status, ctype=ctype, **draw(framing), **draw(timing))


def good_wire(stream: bool = True) -> Wire:
    """A valid reply (the suites' sanity case: it must end ``ok``)."""
    if stream:
        return Wire(True, stream_body([Event(GOOD_CHUNK)], "finish+done", 1))
    doc = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "The answer."},
                        "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    return Wire(False, dump(doc), ctype="application/json", framing="length")


# ------------------------------------------------------------------------------------------------- serving it


def serve(wire: Wire) -> Reply:
    """A HostileServer reply that writes ``wire``: the head, then the body in its pieces with its pauses, its stall
    before the last piece, cut where it says; the connection is kept only when the reply was complete and framed."""
    head_, body = wire.head_and_body()
    if wire.cut is not None:
        body = body[: wire.cut]
    cuts = [0, *sorted({c % (len(body) + 1) for c in wire.pieces} - {0}), len(body)]
    parts = [body[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a] or [b""]

    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(head_)
        for i, p in enumerate(parts):
            if i and wire.pause_s:
                await asyncio.sleep(wire.pause_s)
            if i == len(parts) - 1 and wire.stall_s:
                await w.drain()
                await asyncio.sleep(wire.stall_s)
            w.write(p)
            await w.drain()
        return wire.cut is None and wire.framing in ("chunked", "length")

    return reply


# ------------------------------------------------------------------------------------------------- regressions


def to_plain(v: Any) -> Any:
    """An example's arguments as JSON: bytes (and Raw parts) as {"latin1": ...}, every byte one code point."""
    if isinstance(v, Wire):
        return {"wire": v.to_json()}
    if isinstance(v, Raw):
        return {"raw": v.data.decode("latin-1")}
    if isinstance(v, bytes):
        return {"latin1": v.decode("latin-1")}
    if isinstance(v, dict):
        return {"dict": [[to_plain(k), to_plain(x)] for k, x in v.items()]}
    if isinstance(v, list | tuple):
        return [to_plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    return v


def from_plain(v: Any) -> Any:
    if isinstance(v, list):
        return [from_plain(x) for x in v]
    if isinstance(v, dict):
        (kind, x), = v.items()
        if kind == "wire":
            return Wire.from_json(x)
        if kind == "raw":
            return Raw(x.encode("latin-1"))
        if kind == "latin1":
            return x.encode("latin-1")
        if kind == "float":
            return float(x)
        return {from_plain(k): from_plain(y) for k, y in x}
    return v


def save_regression(suite: str, args: dict[str, Any], error: BaseException) -> Path | None:
    """``./dev fuzz`` (SYNTHWATCH_FUZZ_SAVE=1): the falsifying example that Hypothesis reports last (the shrunk
    one) is written to tests/fuzz_regressions/<suite>-<hash>.json, which a plain test replays on every run."""
    _failing.add(suite)
    if not os.environ.get("SYNTHWATCH_FUZZ_SAVE"):
        return None
    from hypothesis.control import current_build_context

    try:
        if not current_build_context().is_final:
            return None  # Hypothesis is still shrinking: only the final, minimal example is kept
    except Exception:  # outside a Hypothesis test (a replay): nothing to save
        return None
    data = {k: to_plain(v) for k, v in args.items()}
    key = hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
    REGRESSIONS.mkdir(exist_ok=True)
    path = REGRESSIONS / f"{suite}-{key}.json"
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    path.write_text(json.dumps({"suite": suite, "found": time.strftime("%Y-%m-%d"),
                                "failure": f"{type(error).__name__}: {first}", "args": data}, indent=1) + "\n")
    return path


def regression_files(suite: str) -> list[Path]:
    return sorted(p for p in REGRESSIONS.glob(f"{suite}-*.json"))


def load_regression(path: Path, request: Any = None) -> dict[str, Any]:
    """A saved example's arguments (as the property function takes them). A file with ``"open"`` names a bug that
    another branch fixes: with ``request`` the test is marked xfail(strict), so it fails once the bug is fixed, until
    the ``"open"`` line is removed from the file."""
    d = json.loads(path.read_text())
    if d.get("open") and request is not None:
        import pytest

        request.applymarker(pytest.mark.xfail(strict=True, reason=d["open"]))
    return {k: from_plain(v) for k, v in d["args"].items()}
