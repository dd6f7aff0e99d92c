"""Server-side SVG charts: escaped labels, labelled time axes, sane scales, empty states."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET

from synthwatch.app.charts import Line, fmt_value, nice_max, run_charts, time_chart

T0 = 1_800_000_000


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML or this raises


def test_labels_are_escaped_and_the_svg_is_well_formed() -> None:
    evil = '<script>alert(1)</script>" onload="x'
    svg = str(time_chart(evil, [T0, T0 + 5], [Line(evil, [1.0, 2.0])], y_label=evil, chart_id=evil))
    assert "<script>" not in svg and 'onload="x' not in svg
    assert "&lt;script&gt;" in svg
    root = _parse(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert evil in texts  # shown as text, not markup


def test_time_axis_is_labelled_in_local_time() -> None:
    times = [T0 + 5 * i for i in range(60)]
    svg = str(time_chart("Requests", times, [Line("ok/s", [float(i % 7) for i in range(60)])], y_label="requests / s"))
    root = _parse(svg)
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "time (server local)" in texts and "requests / s" in texts
    ticks = [t for t in texts if len(t) == 8 and t.count(":") == 2]
    assert len(ticks) >= 3
    assert ticks[0] >= dt.datetime.fromtimestamp(T0).strftime("%H:%M:%S")[:5]
    # y axis: 0 at the bottom, a round maximum above the peak (6)
    assert "0" in texts and "6" in texts


def test_empty_chart_says_so() -> None:
    svg = str(time_chart("Nothing", [], [Line("a", [])], y_label="x", t0=T0, t1=T0 + 300))
    assert "no data yet" in svg
    _parse(svg)


def test_gaps_break_lines_and_stacked_areas_add_up() -> None:
    times = [T0, T0 + 5, T0 + 10, T0 + 15]
    svg = str(time_chart("Gaps", times, [Line("a", [1.0, None, 2.0, 3.0])], y_label="x"))
    root = _parse(svg)
    assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 1  # [2, 3]; the lone 1.0 is a dot
    assert len(root.findall("{http://www.w3.org/2000/svg}circle")) == 1
    svg = str(time_chart("Stack", times, [Line("r", [3.0] * 4, area=True), Line("c", [2.0] * 4, area=True)],
                         y_label="tok/s"))
    texts = [t.text for t in _parse(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert "5" in texts or "6" in texts  # the scale covers the sum, not the largest part


def test_number_formatting() -> None:
    assert nice_max(0) == 1 and nice_max(7.3) == 8 and nice_max(1234) == 1500
    assert fmt_value(0) == "0" and fmt_value(2500) == "2.5k" and fmt_value(0.25) == "0.25"
    assert fmt_value(3_000_000) == "3M"


def test_run_charts_from_timeseries() -> None:
    points = [{"t": T0 + 5 * i, "req_s": 2.0, "ok_s": 1.8, "tok_s": 100.0, "reasoning_tok_s": 70.0,
               "content_tok_s": 30.0, "timeouts_s": 0.2, "errors_s": 0.0, "attempt_timeouts_s": 0.2,
               "http_429_s": 0.0, "http_5xx_s": 0.0, "dropped_s": 0.0, "timeout_share": 0.08,
               "empty_reasoning_share": 0.0, "mean_latency_s": 3.0, "in_flight": 7.0, "concurrency": 8.0}
              for i in range(20)]
    charts = run_charts({"points": points, "bucket_s": 5, "start": T0, "end": T0 + 100})
    ids = [_parse(str(c)).get("data-chart") for c in charts]
    assert ids == ["requests", "tokens", "failures", "shares", "latency", "inflight"]
    # the 8% timeout share is drawn above the 5% alarm line
    assert "5% alarm line" in str(charts[3])
