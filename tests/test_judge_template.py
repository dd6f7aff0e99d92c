"""The judge's template is checked against the dataset before the first request (#38): a {reference} whose field
no row has refuses the run (exit 2, naming the fields that exist), and `judge.reference_field` says which field
{reference} reads. A real judge HTTP server records what it was sent; the generating server is the simulator."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import run_cli
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from synthwatch.config import JudgeConfig
from synthwatch.store.db import open_engine
from synthwatch.workers.judge import missing_fields, render


class RecordingJudge:
    """An OpenAI-compatible judge on a real port: every chat request's messages are kept; each reply is a verdict."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._reply({"object": "list", "data": [{"id": "rec-judge", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.sent.append(req["messages"][-1]["content"])
                verdict = json.dumps({"score": 0.9, "label": "good", "reason": "fine"})
                self._reply({"id": "j", "object": "chat.completion", "model": "rec-judge",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": verdict},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def judge_server() -> Iterator[RecordingJudge]:
    j = RecordingJudge()
    j.thread.start()
    try:
        yield j
    finally:
        j.server.shutdown()
        j.server.server_close()


def dataset(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + 1?", "answer": f"ANS-{i + 1}"}) + "\n")
    return path


def toml(path: Path, gen: str, judge: str, data: Path, extra: str = "") -> Path:
    path.write_text(f"""
name = "refjudge"
model = "sim-reasoner"
concurrency = 4
[dataset]
path = "{data}"
[[endpoints]]
base_url = "{gen}"
[judge]
model = "rec-judge"
concurrency = 2
prompt_template = "Question: {{prompt}}\\nAnswer: {{answer}}\\nReference: {{reference}}\\nReply with JSON."
{extra}
[judge.endpoint]
base_url = "{judge}"
""")
    return path


def test_a_reference_the_dataset_lacks_refuses_the_run_naming_its_fields(tmp_path, sim, db_path,  # type: ignore[no-untyped-def]
                                                                        judge_server) -> None:
    """The answer is in `answer`; {reference} reads `reference` by default: refused before any request, one line."""
    gen = sim(seed=3, reasoning_tokens="3-5", content_tokens="3-5")
    cfg = toml(tmp_path / "run.toml", gen, judge_server.url, dataset(tmp_path / "d.jsonl", 5))
    res = run_cli("run", "--config", str(cfg), "--db", str(db_path), "--quiet")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "{reference}" in lines[0] and "'reference'" in lines[0] and "judge.reference_field" in lines[0]
    assert "the dataset's fields: id, prompt, answer" in lines[0]
    assert judge_server.sent == []
    engine = open_engine(str(db_path))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM run")).scalar() == 0  # nothing loaded, nothing asked


def test_reference_field_gives_the_judge_the_datasets_answer(tmp_path, sim, db_path, judge_server) -> None:  # type: ignore[no-untyped-def]
    gen = sim(seed=4, reasoning_tokens="3-5", content_tokens="3-5")
    cfg = toml(tmp_path / "run.toml", gen, judge_server.url, dataset(tmp_path / "d.jsonl", 6),
               extra='reference_field = "answer"')
    run_cli("run", "--config", str(cfg), "--db", str(db_path), "--quiet", check=True, timeout=300)
    engine = open_engine(str(db_path))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT r.prompt_json, v.state FROM record r JOIN check_verdict v ON v.record_id ="
                                 " r.id AND v.check_name = 'judge'")).all()
    assert len(rows) == 6 and {r[1] for r in rows} == {"pass"}
    assert len(judge_server.sent) == 6
    for prompt_json, _state in rows:
        i = int(orjson.loads(prompt_json)[-1]["content"].split()[2])
        assert sum(f"Reference: ANS-{i + 1}\n" in m for m in judge_server.sent) == 1


def test_synthwatch_judge_refuses_a_reference_the_records_did_not_keep(tmp_path, sim, db_path,  # type: ignore[no-untyped-def]
                                                                      judge_server) -> None:
    """A run loaded without [judge] kept no row fields: `synthwatch judge --config` with {reference} says so."""
    gen = sim(seed=5, reasoning_tokens="3-5", content_tokens="3-5")
    data = dataset(tmp_path / "d.jsonl", 3)
    run_cli("run", "--dataset", str(data), "--base-url", gen, "--model", "sim-reasoner", "--db", str(db_path),
            "--name", "plain", "--quiet", check=True)
    cfg = toml(tmp_path / "j.toml", gen, judge_server.url, data, extra='reference_field = "answer"')
    res = run_cli("judge", "plain", "--db", str(db_path), "--config", str(cfg))
    assert res.returncode == 2 and "'answer'" in res.stderr and "judge.reference_field" in res.stderr, res.stderr
    # so does a resume that adds the judge: refused before a config version is made or a request sent
    res = run_cli("run", "--config", str(cfg), "--name", "plain", "--new-config-version", "--db", str(db_path))
    assert res.returncode == 2 and "no record of the run kept the dataset field 'answer'" in res.stderr, res.stderr
    assert judge_server.sent == []
    with open_engine(str(db_path)).connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM config_version")).scalar() == 1


CFG = {"endpoint": {"base_url": "http://127.0.0.1:1/v1"}, "model": "j"}


def test_the_reference_is_read_from_reference_field_with_dotted_paths() -> None:
    rec = {"prompt_json": orjson.dumps([{"role": "user", "content": "Q?"}]).decode(), "reasoning": "R",
           "content": "A", "row_json": '{"reference": "no", "meta": {"gold": "42"}}'}
    assert render("{answer} vs {reference}", rec, "meta.gold") == "A vs 42"
    assert render("{answer} vs {reference}", rec) == "A vs no"
    cfg = JudgeConfig.model_validate({**CFG, "prompt_template": "{reference}", "reference_field": "meta.gold"})
    assert missing_fields(cfg, [None, {"meta": {"gold": 1}}]) == []
    assert missing_fields(cfg, [{"gold": 1}, {"meta": {}}]) == ["meta.gold"]
    no_ref = JudgeConfig.model_validate({**CFG, "prompt_template": "{answer}", "reference_field": "meta.gold"})
    assert missing_fields(no_ref, [{}]) == []  # a template without {reference} reads no field


@given(st.lists(st.dictionaries(st.sampled_from(["a", "b", "reference"]), st.integers(), max_size=3), max_size=6))
def test_a_field_is_missing_exactly_when_no_row_has_it(rows: list[dict[str, int]]) -> None:
    cfg = JudgeConfig.model_validate({**CFG, "prompt_template": "R: {reference}", "reference_field": "b"})
    assert (missing_fields(cfg, rows) == ["b"]) == (not any("b" in r for r in rows))


def test_a_parquet_datasets_reference_column_is_kept_and_a_missing_one_named(tmp_path: Path) -> None:
    """Parquet reads only the columns it needs: the kept fields' columns are among them (before, every row kept {}:
    the judge's reference and the verifiers' were empty)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from synthwatch.config import DatasetConfig
    from synthwatch.sources.datasets import field_names, load_dataset

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["What is 1 + 1?", "What is 2 + 1?"], "answer": ["2", "3"],
                             "meta": [{"gold": "two"}, {"gold": "three"}]}), path)
    spec = DatasetConfig(path=str(path))
    loaded = load_dataset(spec, ("answer", "meta.gold", "reference"))
    assert [p.row for p in loaded.prompts] == [{"answer": "2", "meta.gold": "two"}, {"answer": "3", "meta.gold": "three"}]
    assert [p.messages[-1]["content"] for p in loaded.prompts] == ["What is 1 + 1?", "What is 2 + 1?"]
    cfg = JudgeConfig.model_validate({**CFG, "prompt_template": "{reference}"})
    assert missing_fields(cfg, (p.row for p in loaded.prompts)) == ["reference"]
    assert field_names(spec) == ["prompt", "answer", "meta"]
