"""Length distributions: histograms of reasoning, content and all output tokens, binned in SQL.

A record's tokens are its stored ``completion_tokens`` (the server's usage) split between reasoning and
content in proportion to the stored texts' lengths (``reasoning_len``, ``content_len``). The split reads the
texts that were captured, so a reasoning field that came back empty counts 0 reasoning tokens even when the
server counted some: the pile at zero is the story's failure. Every column read is in the records table's
filter index (``ix_record_filter``), so a histogram walks that index and never a record's texts.

Bins: bin 0 holds records with exactly 0 tokens, bins 1..n split 1 .. the largest output below ``max_tokens`` in
equal widths, and bin n + 1 holds records at (or past) ``max_tokens``: truncation and empty reasoning each get a
bar of their own. Without a ``max_tokens`` there is no limit bar.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from .filters import COUNT_CAP, Filters
from .queries import matching

BINS = 40
KINDS = ("reasoning", "content", "output")
KIND_LABELS = {"reasoning": "reasoning tokens", "content": "content tokens", "output": "all output tokens"}
CAP = COUNT_CAP  # at most this many records (the newest by id): ~0.2 s of index walk on SQLite

# per record: its reasoning tokens (r), content tokens (c) and all output tokens (o)
_SPLIT = (
    "SELECT o, r, o - r AS c FROM (SELECT completion_tokens AS o,"
    " CASE WHEN reasoning_len + content_len > 0"
    " THEN CAST(ROUND(completion_tokens * reasoning_len * 1.0 / (reasoning_len + content_len)) AS INTEGER)"
    " ELSE 0 END AS r FROM ({inner}) AS m) AS s"
)


def _bin(col: str) -> str:
    return (f"CASE WHEN {col} <= 0 THEN 0 WHEN {col} >= :limit THEN :n + 1 WHEN {col} > :hi THEN :n"
            f" ELSE ({col} - 1) / :w + 1 END")


def max_tokens_of(run: dict[str, Any]) -> int | None:
    """The run's current sampling.max_tokens (None: the server's own limit)."""
    v = ((run.get("config") or {}).get("sampling") or {}).get("max_tokens")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _selection(conn: Connection, run_id: int, f: Filters, cap: int) -> tuple[str, dict[str, Any]]:
    inner, params = matching(conn, run_id, f, ("completion_tokens", "reasoning_len", "content_len"),
                                    where="{p}completion_tokens IS NOT NULL")
    idcol = "r.id" if "record_fts" in inner else "id"
    params["cap"] = cap
    return f"{inner} ORDER BY {idcol} DESC LIMIT :cap", params


def largest(conn: Connection, run_id: int, f: Filters | None = None, cap: int = CAP) -> int:
    """The largest output (tokens) among the records a filter matches."""
    inner, params = _selection(conn, run_id, f or Filters(), cap)
    return int(conn.execute(text(f"SELECT COALESCE(MAX(o), 0) FROM ({_SPLIT.format(inner=inner)}) AS t"),
                            params).scalar_one())


def round_step(x: int) -> int:
    """The smallest 1, 2 or 5 x 10^k at least x: bin edges (and so the axis ticks) fall on round numbers (#28)."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= x:
                return m * step
        step *= 10


def layout(top: int, max_tokens: int | None, bins: int = BINS) -> tuple[int, int, int, int]:
    """(bin width, bins between 0 and the limit, the highest count they cover, the limit).

    Bins 1..n cover 1 .. the largest output below the limit, so lengths far below max_tokens still get
    their detail; the limit bar (max_tokens and up) stays last either way. The width is a round step (1, 2 or 5
    x 10^k), so between bins/2 and bins bins are used."""
    hi = max(1, min(top, max_tokens - 1) if max_tokens else top)
    width = round_step(-(-hi // bins))
    n = max(1, -(-hi // width))
    return width, n, hi, max_tokens if max_tokens else hi + 1


def histogram(conn: Connection, run_id: int, f: Filters | None = None, *, max_tokens: int | None = None,
              top: int | None = None, cap: int = CAP) -> dict[str, Any]:
    """Counts per bin of each kind over the records a filter matches (that have token counts).

    ``top``: the largest output to cover (compare pages share one range); without it, the selection's own
    largest. Two short statements (the range, then the bins)."""
    f = f or Filters()
    inner, params = _selection(conn, run_id, f, cap)
    if top is None:
        top = largest(conn, run_id, f, cap)
    width, n, hi, limit = layout(top, max_tokens)
    sql = (f"SELECT {_bin('r')} AS rb, {_bin('c')} AS cb, {_bin('o')} AS ob, COUNT(*) AS k"
           f" FROM ({_SPLIT.format(inner=inner)}) AS t GROUP BY rb, cb, ob")
    counts = {k: [0] * (n + 2) for k in KINDS}
    total = 0
    for rb, cb, ob, k in conn.execute(text(sql), {**params, "limit": limit, "n": n, "w": width, "hi": hi}):
        total += k
        for kind, b in (("reasoning", rb), ("content", cb), ("output", ob)):
            counts[kind][min(int(b), n + 1)] += k
    if not max_tokens:  # no limit bar: nothing can reach it
        for kind in KINDS:
            counts[kind].pop()
    return {"max_tokens": max_tokens, "bin_width": width, "bins": bins_of(width, n, hi, max_tokens),
            "counts": counts, "records": total, "capped": total >= cap, "cap": cap}


def bins_of(width: int, n: int, hi: int, max_tokens: int | None) -> list[dict[str, Any]]:
    """Each bin's lowest and highest token count (the limit bar: max_tokens and up, hi None)."""
    out: list[dict[str, Any]] = [{"lo": 0, "hi": 0}]
    out += [{"lo": (i - 1) * width + 1, "hi": min(i * width, hi)} for i in range(1, n + 1)]
    if max_tokens:
        out.append({"lo": max_tokens, "hi": None})
    return out


def at_limit(h: dict[str, Any], kind: str = "output") -> int:
    """Records at max_tokens (0 without a limit)."""
    return int(h["counts"][kind][-1]) if h["max_tokens"] else 0
