"""Server-side SVG charts: no JavaScript, no network, readable in a screenshot.

Every piece of text that goes into the SVG (titles, series labels, endpoint names) passes
through :func:`esc`; numbers are formatted by us. The result is returned as ``Markup`` so the
template can inline it; nothing from model output ever reaches a chart.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from markupsafe import Markup

PALETTE = {
    "blue": "#1f5fbf", "green": "#2e7d32", "red": "#c62828", "amber": "#d08a00", "purple": "#6a3fb5",
    "grey": "#7a808a", "teal": "#00838f", "pink": "#ad1457",
}


def esc(s: object) -> str:
    return escape(str(s), quote=True)


@dataclass
class Line:
    label: str
    values: Sequence[float | None]
    color: str = "blue"
    dashed: bool = False
    area: bool = False  # stacked areas: drawn on top of the previous area lines


def nice_max(v: float) -> float:
    if v <= 0 or not math.isfinite(v):
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def fmt_value(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1_000_000:
        return f"{v / 1_000_000:.1f}M".replace(".0M", "M")
    if a >= 10_000:
        return f"{v / 1000:.0f}k"
    if a >= 1000:
        return f"{v / 1000:.1f}k".replace(".0k", "k")
    if a >= 10:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.1f}".replace(".0", "")
    return f"{v:.2f}"


def _time_fmt(span_s: float) -> str:
    return "%H:%M:%S" if span_s <= 900 else ("%H:%M" if span_s <= 2 * 86400 else "%m-%d %H:%M")


def _time_ticks(t0: float, t1: float, n: int = 5) -> list[float]:
    span = max(t1 - t0, 1.0)
    steps = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800)
    step = next((s for s in steps if span / s <= n), steps[-1])
    first = math.ceil(t0 / step) * step
    return [float(t) for t in range(int(first), int(t1) + 1, step)]


def time_chart(
    title: str,
    times: Sequence[float],
    lines: Sequence[Line],
    *,
    y_label: str,
    t0: float | None = None,
    t1: float | None = None,
    width: int = 600,
    height: int = 220,
    y_min_max: float = 0.0,
    threshold: tuple[float, str] | None = None,
    chart_id: str = "",
) -> Markup:
    """A time-series chart: x is Unix seconds (labelled in server-local time), y starts at 0."""
    left, right, top, bottom = 52, 12, 40, 38
    pw, ph = width - left - right, height - top - bottom
    out: list[str] = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        f' xmlns="http://www.w3.org/2000/svg" data-chart="{esc(chart_id)}" data-points="{len(times)}"'
        f' font-family="system-ui, DejaVu Sans, sans-serif" font-size="11">',
        f"<title>{esc(title)}</title>",
        f'<text x="{left}" y="14" font-size="13" font-weight="600" fill="#1d1f23">{esc(title)}</text>',
    ]
    # legend
    lx: float = left
    for ln in lines:
        color = PALETTE.get(ln.color, ln.color)
        dash = ' stroke-dasharray="4 3"' if ln.dashed else ""
        out.append(f'<line x1="{lx}" y1="28" x2="{lx + 16}" y2="28" stroke="{esc(color)}" stroke-width="3"{dash}/>')
        out.append(f'<text x="{lx + 20}" y="32" fill="#333">{esc(ln.label)}</text>')
        lx += 28 + 6.2 * len(ln.label)
    if not times:
        lo = t0 if t0 is not None else 0.0
        hi = t1 if t1 is not None else lo + 300
    else:
        lo = t0 if t0 is not None else min(times)
        hi = t1 if t1 is not None else max(times)
    if hi <= lo:
        hi = lo + 60

    # stacked areas add up; other lines stand alone
    stacked: list[list[float]] = []
    acc = [0.0] * len(times)
    for ln in lines:
        if ln.area:
            acc = [a + (v or 0.0) for a, v in zip(acc, ln.values, strict=False)]
            stacked.append(list(acc))
    peak = max([y_min_max] + [v for ln in lines for v in ln.values if v is not None]
               + [v for s in stacked for v in s])
    if threshold:
        peak = max(peak, threshold[0] * 1.2)
    ymax = nice_max(peak)

    def x(t: float) -> float:
        return left + (t - lo) / (hi - lo) * pw

    def y(v: float) -> float:
        return top + ph - (v / ymax) * ph

    # grid and y axis
    for i in range(5):
        v = ymax * i / 4
        yy = y(v)
        out.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" stroke="#e3e5e9"/>')
        out.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end" fill="#555">{esc(fmt_value(v))}</text>')
    out.append(f'<text transform="translate(12 {top + ph / 2:.0f}) rotate(-90)" text-anchor="middle"'
               f' fill="#555">{esc(y_label)}</text>')
    # time axis
    fmt = _time_fmt(hi - lo)
    for t in _time_ticks(lo, hi):
        xx = x(t)
        label = dt.datetime.fromtimestamp(t).strftime(fmt)
        out.append(f'<line x1="{xx:.1f}" y1="{top + ph}" x2="{xx:.1f}" y2="{top + ph + 4}" stroke="#888"/>')
        out.append(f'<text x="{xx:.1f}" y="{top + ph + 16}" text-anchor="middle" fill="#555">{esc(label)}</text>')
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#888"/>')
    out.append(f'<text x="{left + pw}" y="{height - 4}" text-anchor="end" fill="#555">time (server local)</text>')

    if threshold:
        tv, tl = threshold
        yy = y(tv)
        out.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" stroke="#c62828"'
                   f' stroke-dasharray="6 4"/>')
        out.append(f'<text x="{left + pw - 4}" y="{yy - 4:.1f}" text-anchor="end" fill="#c62828">{esc(tl)}</text>')

    if not times:
        out.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" fill="#888"'
                   ' font-size="13">no data yet</text>')
    else:
        prev_top: list[float] | None = None
        si = 0
        for ln in lines:
            color = esc(PALETTE.get(ln.color, ln.color))
            if ln.area:
                top_vals = stacked[si]
                si += 1
                upper = [f"{x(t):.1f},{y(v):.1f}" for t, v in zip(times, top_vals, strict=False)]
                base = prev_top if prev_top is not None else [0.0] * len(times)
                lower = [f"{x(t):.1f},{y(v):.1f}" for t, v in reversed(list(zip(times, base, strict=False)))]
                out.append(f'<polygon points="{" ".join(upper + lower)}" fill="{color}" fill-opacity="0.35"'
                           f' stroke="none"/>')
                out.append(f'<polyline points="{" ".join(upper)}" fill="none" stroke="{color}" stroke-width="1.5"/>')
                prev_top = top_vals
                continue
            dash = ' stroke-dasharray="5 3"' if ln.dashed else ""
            seg: list[str] = []
            segs: list[list[str]] = []
            for t, val in zip(times, ln.values, strict=False):
                if val is None:
                    if seg:
                        segs.append(seg)
                    seg = []
                    continue
                seg.append(f"{x(t):.1f},{y(val):.1f}")
            if seg:
                segs.append(seg)
            for sg in segs:
                if len(sg) == 1:
                    cx, cy = sg[0].split(",")
                    out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
                else:
                    out.append(f'<polyline points="{" ".join(sg)}" fill="none" stroke="{color}" stroke-width="2"'
                               f' stroke-linejoin="round"{dash}/>')
    out.append("</svg>")
    return Markup("".join(out))  # noqa: S704 - every text above went through esc()


def run_charts(data: dict[str, object]) -> list[Markup]:
    """The run page's charts from :func:`synthwatch.app.timeseries.timeseries` output."""
    pts: list[dict[str, object]] = data["points"]  # type: ignore[assignment]
    times = [float(p["t"]) + float(data["bucket_s"]) / 2 for p in pts]  # type: ignore[arg-type]
    t0, t1 = float(data["start"]), float(data["end"])  # type: ignore[arg-type]

    def col(k: str) -> list[float | None]:
        return [p[k] for p in pts]  # type: ignore[misc]

    def opt(k: str) -> list[float | None]:
        return [p.get(k) for p in pts]  # type: ignore[misc]

    # with several endpoints, each one's queue and KV cache get a line of their own (at most four)
    names = sorted({ep for p in pts for ep in (p.get("server_by_endpoint") or {})})  # type: ignore[attr-defined]
    eps_colors = list(zip(names, ("amber", "teal", "pink", "grey"), strict=False)) if len(names) > 1 else []

    def per_ep(ep: str, k: str) -> list[float | None]:
        return [((p.get("server_by_endpoint") or {}).get(ep) or {}).get(k) for p in pts]  # type: ignore[attr-defined]

    def pct(k: str) -> list[float | None]:
        return [None if p[k] is None else float(p[k]) * 100 for p in pts]  # type: ignore[arg-type]

    per = f" (per {data['bucket_s']} s bucket)" if int(data["bucket_s"]) > 5 else ""  # type: ignore[call-overload]
    return [
        time_chart("Completed requests/s" + per, times, [
            Line("ok/s", col("ok_s"), "green"),
            Line("finished/s (ok + failed)", col("req_s"), "blue", dashed=True),
        ], y_label="requests / s", t0=t0, t1=t1, chart_id="requests"),
        time_chart("Output tokens/s: reasoning vs content", times, [
            Line("reasoning tok/s", col("reasoning_tok_s"), "purple", area=True),
            Line("content tok/s", col("content_tok_s"), "teal", area=True),
        ], y_label="tokens / s", t0=t0, t1=t1, chart_id="tokens"),
        time_chart("Failures/s", times, [
            Line("timeouts (final)", col("timeouts_s"), "red"),
            Line("errors (final)", col("errors_s"), "pink"),
            Line("attempt timeouts", col("attempt_timeouts_s"), "amber", dashed=True),
            Line("429", col("http_429_s"), "purple", dashed=True),
            Line("5xx", col("http_5xx_s"), "grey", dashed=True),
            Line("dropped", col("dropped_s"), "teal", dashed=True),
        ], y_label="events / s", t0=t0, t1=t1, chart_id="failures"),
        time_chart("Timeout and empty-reasoning share (%)", times, [
            Line("timeouts % of finished", pct("timeout_share"), "red"),
            Line("empty reasoning % of ok", pct("empty_reasoning_share"), "amber"),
        ], y_label="percent", t0=t0, t1=t1, y_min_max=10, threshold=(5.0, "5% alarm line"), chart_id="shares"),
        time_chart("Mean end-to-end latency", times, [
            Line("mean latency (s)", col("mean_latency_s"), "blue"),
        ], y_label="seconds", t0=t0, t1=t1, chart_id="latency"),
        time_chart("In flight vs concurrency", times, [
            Line("in flight", col("in_flight"), "green"),
            Line("concurrency limit", col("concurrency"), "grey", dashed=True),
        ] + ([Line("server: running", opt("server_running"), "blue", dashed=True),
              Line("server: waiting (queue)", opt("server_waiting"), "red")] if data.get("server") else [])
            + [Line(f"waiting @{ep}", per_ep(ep, "waiting"), color, dashed=True) for ep, color in eps_colors],
            y_label="requests", t0=t0, t1=t1, chart_id="inflight"),
    ] + ([
        time_chart("Server: KV cache and preemptions, per endpoint", times, [
            Line("KV cache used (%)", [None if v is None else v * 100 for v in opt("server_kv_usage")], "purple"),
            Line("preemptions/s x100", [None if v is None else v * 100 for v in opt("server_preemptions_s")], "red"),
        ] + [Line(f"KV % @{ep}", [None if v is None else v * 100 for v in per_ep(ep, "kv_usage")], color,
                  dashed=True) for ep, color in eps_colors],
            y_label="percent", t0=t0, t1=t1, y_min_max=100, chart_id="server"),
        time_chart("Output tokens/s: server vs client", times, [
            Line("server generated", opt("server_gen_tok_s"), "grey", dashed=True),
            Line("client received", col("tok_s"), "teal"),
        ], y_label="tokens / s", t0=t0, t1=t1, chart_id="server_tokens"),
    ] if data.get("server") else [])
