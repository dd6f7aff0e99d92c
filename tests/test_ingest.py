"""Shape detection and line -> record mapping (synthwatch.sources.ingest), and `synthwatch import` end to end."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import require
from sqlalchemy import text

from synthwatch.sources.ingest import LineError, LineParser, MapError, parse_map

# a copy of the shared seed file (/work/shared/data/raw_responses_sample.jsonl) kept with the tests
SEED = Path(__file__).parent / "data" / "raw_responses_sample.jsonl"


def line(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def test_seed_file_is_the_hand_written_script_shape() -> None:
    require(SEED.exists(), f"{SEED} missing")
    p = LineParser()
    rows = [p.parse(raw) for raw in SEED.read_bytes().splitlines()]
    assert dict(p.counts) == {"script": 24}
    assert "`question` is the prompt" in p.describe()
    first = rows[0]
    assert first.messages == [{"role": "user", "content": json.loads(SEED.read_text().splitlines()[0])["question"]}]
    assert first.source_id == "8411" and first.latency_s == 83.3 and first.status == "ok"
    ex = first.extracted
    assert ex is not None and ex.reasoning == "" and ex.reasoning_source == "none"
    assert ex.finish_reason == "stop" and ex.usage == {"prompt_tokens": 68, "completion_tokens": 68}
    assert sum(1 for r in rows if not r.extracted.reasoning) == 16
    assert rows[-1].extracted.reasoning_source == "reasoning" and rows[-1].extracted.reasoning


COMPLETION = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1_790_000_000, "model": "deepseek-v4",
    "system_fingerprint": "fp1",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "4", "reasoning_content": "2+2 is 4", "foo": 1}}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 7, "completion_tokens_details": {"reasoning_tokens": 5}},
}

SHAPE_CASES = [
    # (name, line, shape, status, reasoning, content, source, prompt)
    ("chat.completion", COMPLETION, "chat.completion", "ok", "2+2 is 4", "4", "reasoning_content", None),
    ("openai batch", {"id": "b1", "custom_id": "req-7", "response": {"status_code": 200, "body": COMPLETION},
                      "error": None}, "openai-batch", "ok", "2+2 is 4", "4", "reasoning_content", None),
    ("openai batch error", {"id": "b2", "custom_id": "req-8", "response": None,
                            "error": {"message": "rate limited"}}, "openai-batch", "error", None, None, None, None),
    ("record with messages", {"messages": [{"role": "user", "content": "hi"}], "reasoning": "think",
                              "content": "hello", "finish_reason": "stop", "usage": {"completion_tokens": 3}},
     "record", "ok", "think", "hello", "reasoning", "hi"),
    ("record with prompt + reasoning_content", {"prompt": "hi", "reasoning_content": "hmm", "content": "yo"},
     "record", "ok", "hmm", "yo", "reasoning_content", "hi"),
    ("record with inline think", {"prompt": "hi", "content": "<think>inner</think>\n\nanswer"},
     "record", "ok", "inner", "answer", "inline", "hi"),
    ("script", {"idx": 3, "question": "q?", "reasoning": "", "content": "a", "finish_reason": "stop"},
     "script", "ok", "", "a", "none", "q?"),
    ("script failure", {"idx": 4, "question": "q?", "error": "ReadTimeout"}, "script", "error", None, None, None,
     "q?"),
    ("specforge ok", {"id": "s1", "status": "success", "conversations": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "reasoning_content": "r"}]},
     "specforge", "ok", "r", "yo", "reasoning_content", "hi"),
    ("specforge error", {"id": "s2", "status": "error", "error": "context too long",
                         "conversations": [{"role": "user", "content": "hi"}]},
     "specforge", "error", None, None, None, "hi"),
    ("sharegpt export", {"id": "c1", "conversations": [{"from": "human", "value": "hi"},
                                                       {"from": "gpt", "value": "<think>r</think>yo"}]},
     "conversations", "ok", "r", "yo", "inline", "hi"),
    ("messages export", {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "yo", "reasoning_content": "r"}]},
     "messages", "ok", "r", "yo", "reasoning_content", "hi"),
]


@pytest.mark.parametrize(("shape_line", "shape", "status", "reasoning", "content", "source", "prompt"),
                         [c[1:] for c in SHAPE_CASES], ids=[c[0] for c in SHAPE_CASES])
def test_every_known_shape_is_recognised(shape_line: Any, shape: str, status: str, reasoning: str | None,
                                         content: str | None, source: str | None, prompt: str | None) -> None:
    p = LineParser()
    r = p.parse(line(shape_line))
    assert (r.shape, r.status) == (shape, status)
    if status == "error":
        assert r.error
    if reasoning is not None:
        assert r.extracted is not None
        assert (r.extracted.reasoning, r.extracted.content, r.extracted.reasoning_source) == (reasoning, content,
                                                                                              source)
    if prompt is not None:
        assert [m["content"] for m in r.messages if m["role"] == "user"] == [prompt]


def test_raw_completion_keeps_everything_the_server_sent() -> None:
    r = LineParser().parse(line(COMPLETION))
    ex = r.extracted
    assert ex.model == "deepseek-v4" and ex.system_fingerprint == "fp1" and ex.response_id == "chatcmpl-1"
    assert ex.extra == {"message": {"foo": 1}}
    assert r.timestamp == 1_790_000_000 and r.source_id == "chatcmpl-1"


def test_unknown_fields_of_flat_records_are_kept_and_timestamps_read() -> None:
    r = LineParser().parse(line({"id": "x", "prompt": "p", "content": "c", "reasoning": "r", "temperature": 0.6,
                                 "timestamp": "2026-01-02T03:04:05Z", "latency_ms": 1500}))
    assert r.extracted.extra == {"top": {"temperature": 0.6}}
    assert r.timestamp == 1767323045.0 and r.latency_s == 1.5 and r.source_id == "x"


@pytest.mark.parametrize(("raw", "reason"), [
    (b'{"question": "q", "reas', "not valid JSON"),
    (b"[1, 2]", "JSON array, not an object"),
    (b'{"prompt": "only a prompt"}', "no known shape (keys: prompt)"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', "looks like a prompt"),
    (b'{"error": {"message": "boom"}}', "an error object"),
    (b'{"choices": []}', "'choices' is empty"),
])
def test_unmatched_lines_say_why(raw: bytes, reason: str) -> None:
    with pytest.raises(LineError) as info:
        LineParser().parse(raw)
    assert reason in str(info.value)


def test_mapping_reads_any_layout() -> None:
    p = LineParser(mapping=parse_map(["reasoning=msg.reasoning", "content=msg.text", "prompt=input.q",
                                      "id=meta.uid", "timestamp=meta.t", "completion_tokens=n.out"]))
    r = p.parse(line({"input": {"q": "why?"}, "msg": {"reasoning": "because", "text": "so"},
                      "meta": {"uid": 17, "t": 1_790_000_001.5}, "n": {"out": 12}, "other": True}))
    assert r.shape == "mapped" and r.messages == [{"role": "user", "content": "why?"}]
    assert (r.extracted.reasoning, r.extracted.content, r.extracted.reasoning_source) == ("because", "so",
                                                                                          "reasoning")
    assert r.source_id == "17" and r.timestamp == 1_790_000_001.5
    assert r.extracted.usage == {"completion_tokens": 12}
    assert r.extracted.extra == {"top": {"other": True}}
    with pytest.raises(LineError, match="--map content=msg.text not found"):
        p.parse(line({"input": {"q": "why?"}}))
    for bad in (["reasoning"], ["colour=x"], ["content=a", "content=b"]):
        with pytest.raises(MapError):
            parse_map(bad)
    with pytest.raises(MapError, match="cannot be combined"):
        LineParser(shape="script", mapping={"content": "a"})


def test_forced_shape_refuses_other_lines() -> None:
    p = LineParser(shape="script")
    with pytest.raises(LineError, match="not the forced shape 'script'"):
        p.parse(line(COMPLETION))


# ------------------------------------------------------------------------------------------ import CLI


def cli(capsys: Any, *args: str) -> tuple[int, str]:
    """The real `synthwatch` entry point in this process (a subprocess costs seconds of imports)."""
    from synthwatch.cli import main

    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr().err


def _write(path: Path, rows: list[Any], *, gz: bool = False, extra: bytes = b"") -> Path:
    data = b"".join(line(r) + b"\n" for r in rows) + extra
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_import_globs_gzip_unmatched_lines_and_reimport(tmp_path: Path, db_path: Path, engine: Any,
                                                        capsys: Any) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    a = _write(parts / "gen_000.jsonl", [{"idx": i, "question": f"q{i}", "reasoning": "r", "content": f"a{i}"}
                                         for i in range(5)], extra=b"this is not json\n\n")
    _write(parts / "gen_001.jsonl.gz", [{"idx": i, "question": f"q{i}", "reasoning": "r", "content": f"a{i}"}
                                        for i in range(5, 9)], gz=True)
    rc, err = cli(capsys, "import", str(parts / "gen_*"), "--db", str(db_path), "--run", "imported")
    assert rc == 0, err
    assert f"{a}:6: unmatched: not valid JSON" in err, err
    assert "gen_000.jsonl: 5 ok, 0 error, 1 unmatched — script ×5" in err
    assert "gen_001.jsonl.gz: 4 ok, 0 error, 0 unmatched — script ×4" in err
    with engine.connect() as conn:
        run = conn.execute(text("SELECT * FROM run WHERE name = 'imported'")).mappings().one()
        assert (run["kind"], run["status"], run["total"], run["n_ok"]) == ("watch", "completed", 9, 9)
        errs = conn.execute(text("SELECT path, line, reason, sample FROM ingest_error")).all()
        assert [(Path(e[0]).name, e[1], e[3]) for e in errs] == [("gen_000.jsonl", 6, "this is not json")]
        ids = [r[0] for r in conn.execute(text("SELECT source_id FROM record ORDER BY idx"))]
        assert ids == [str(i) for i in range(9)]
    # importing again reads nothing twice; an appended line is picked up
    with a.open("ab") as fh:
        fh.write(line({"idx": 99, "question": "late", "reasoning": "r", "content": "x"}) + b"\n")
    rc, err = cli(capsys, "import", str(a), str(parts / "gen_001.jsonl.gz"), "--db", str(db_path), "--run",
                  "imported")
    assert rc == 0 and "gen_000.jsonl: 1 ok" in err and "already imported: nothing new" in err, err
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*), COUNT(DISTINCT idx) FROM record")).one() == (10, 10)
    # nothing readable at all: non-zero exit with the reason
    junk = _write(tmp_path / "junk.jsonl", [{"prompt": "only prompts"}, {"prompt": "here"}])
    rc, err = cli(capsys, "import", str(junk), "--db", str(db_path))
    assert rc == 1 and "junk.jsonl:1: unmatched: no known shape" in err, err
    rc, err = cli(capsys, "import", str(tmp_path / "nope*.jsonl"), "--db", str(db_path))
    assert rc == 2 and "no file matches" in err, err
    # a watched or imported run name cannot take over a generation run
    with engine.connect() as conn, conn.begin():
        conn.execute(text("UPDATE run SET kind = 'generate' WHERE name = 'imported'"))
    rc, err = cli(capsys, "import", str(a), "--db", str(db_path), "--run", "imported")
    assert rc == 2 and "is a generate run, not a watched one" in err, err


def test_seed_shape_with_empty_reasoning_trips_the_alarm(tmp_path: Path, db_path: Path, engine: Any,
                                                         capsys: Any) -> None:
    require(SEED.exists(), f"{SEED} missing")
    try:
        import synthwatch.quality.checks  # noqa: F401
        have_checks = True
    except ImportError:
        have_checks = False
    require(have_checks, "synthwatch.quality.checks is not built yet")
    src = shutil.copy(SEED, tmp_path / "raw_responses.jsonl")
    rc, err = cli(capsys, "import", str(src), "--db", str(db_path))
    assert rc == 0 and "script ×24" in err and "`question` is the prompt" in err, err
    with engine.connect() as conn:
        run_id = conn.execute(text("SELECT id FROM run WHERE name = 'raw_responses'")).scalar_one()
        stat = conn.execute(text("SELECT n_fail, n_total FROM check_stat WHERE run_id = :r AND"
                                 " check_name = 'empty_reasoning'"), {"r": run_id}).one()
        assert tuple(stat) == (16, 24)
        alarm = conn.execute(text("SELECT rule, active, example_record_id FROM alarm WHERE run_id = :r"
                                  " AND rule = 'empty_reasoning'"), {"r": run_id}).one()
        assert alarm[1] and alarm[2] is not None
        flagged = conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND check_flags != 0"
                                    " AND reasoning = ''"), {"r": run_id}).scalar_one()
        assert flagged == 16


def test_synthwatch_exports_read_back_as_the_same_records(tmp_path: Path, db_path: Path, engine: Any,
                                                          capsys: Any) -> None:
    require(SEED.exists(), f"{SEED} missing")
    require(Path(__file__).parent.parent.joinpath("synthwatch", "commands", "export.py").exists(),
            "synthwatch export is not built yet")
    rc, err = cli(capsys, "import", str(SEED), "--db", str(db_path), "--run", "seed")
    assert rc == 0, err
    outs = []
    for fmt, extra in (("messages", []), ("sharegpt", []), ("sharegpt", ["--think-inline"]), ("raw", [])):
        out = tmp_path / f"{fmt}{len(outs)}.jsonl"
        # the seed file's empty-reasoning records raise that alarm: exporting them all is the point here
        rc, err = cli(capsys, "export", "seed", "--db", str(db_path), "-f", fmt, "-o", str(out), "--quiet",
                      "--no-default-exclusions", "--allow-open-alarms", *extra)
        assert rc == 0, err
        outs.append(out)
    for out, shape in zip(outs, ("messages", "conversations", "conversations", "synthwatch-raw"), strict=True):
        rc, err = cli(capsys, "import", str(out), "--db", str(db_path), "--run", out.stem)
        assert rc == 0 and f"24 ok, 0 error, 0 unmatched — {shape} ×24" in err, err
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT run.name, record.source_id, record.prompt_json, record.reasoning, record.content"
            " FROM record JOIN run ON run.id = record.run_id ORDER BY run.id, record.idx")).all()
    by_run: dict[str, list[tuple[Any, ...]]] = {}
    for name, *rest in rows:
        by_run.setdefault(name, []).append(tuple(rest))
    assert len(by_run) == 5
    for name, got in by_run.items():
        assert got == by_run["seed"], name


def test_import_with_map_and_bad_options(tmp_path: Path, db_path: Path, engine: Any, capsys: Any) -> None:
    f = _write(tmp_path / "custom.jsonl", [{"uid": i, "in": {"q": f"q{i}"}, "out": {"thought": "t", "text": str(i)}}
                                           for i in range(3)])
    rc, err = cli(capsys, "import", str(f), "--db", str(db_path))
    assert rc == 1 and f"{f}:1: unmatched: no known shape (keys: in, out, uid)" in err, err
    rc, err = cli(capsys, "import", str(f), "--db", str(db_path), "--run", "mapped", "--map", "prompt=in.q",
                  "--map", "reasoning=out.thought", "--map", "content=out.text", "--map", "id=uid")
    assert rc == 0 and "3 ok, 0 error, 0 unmatched — mapped ×3" in err, err
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT source_id, prompt_json, reasoning, content FROM record r JOIN run"
                                 " ON run.id = r.run_id WHERE run.name = 'mapped' ORDER BY idx")).all()
    assert [tuple(r) for r in rows] == [(str(i), json.dumps([{"role": "user", "content": f"q{i}"}],
                                                          separators=(",", ":")), "t", str(i)) for i in range(3)]
    rc, err = cli(capsys, "import", str(f), "--db", str(db_path), "--map", "thoughts=out.thought")
    assert rc == 2 and "unknown key 'thoughts'" in err, err
    rc, err = cli(capsys, "import", str(f), "--db", str(db_path), "--shape", "yaml")
    assert rc == 2 and "--shape 'yaml': expected one of" in err, err


def test_a_line_too_deep_to_store_is_unmatched_and_the_rest_imported(tmp_path: Path, db_path: Path, engine: Any,
                                                                     capsys: Any) -> None:
    """A line nested 300 levels parsed (orjson reads 1,024) but could not be stored (it writes 254): the whole
    import stopped with "TypeError: Recursion limit reached". What is parsed must be storable, so the line is
    refused at parse time, kept in ingest_error with its reason, and the lines around it are imported (#25)."""
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    path = _write(tmp_path / "gen.jsonl", [{"idx": 0, "question": "q0", "reasoning": "r", "content": "a0"},
                                           {"idx": 1, "question": "q1", "reasoning": "r", "content": "a1",
                                            "extra": deep},
                                           {"idx": 2, "question": "q2", "reasoning": "r", "content": "a2"}])
    rc, err = cli(capsys, "import", str(path), "--db", str(db_path), "--run", "deep")
    assert rc == 0 and "Traceback" not in err, err
    assert f"{path}:2: unmatched: JSON nested more than 128 levels" in err, err
    with engine.connect() as conn:
        assert [r[0] for r in conn.execute(text("SELECT source_id FROM record ORDER BY idx"))] == ["0", "2"]
        assert conn.execute(text("SELECT line, reason FROM ingest_error")).all() == [
            (2, "JSON nested more than 128 levels: more than a record can store")]
