"""Preference pairs from k samples (#38): `synthwatch export --pairs` writes TRL's DPO format, checked with TRL.

A real SQLite file holding k samples per prompt and their verdicts, the real `synthwatch export` process, then the
written file loaded with `datasets` and put through TRL's own dataset utilities (trl.data_utils) and its DPO trainer's
tokenization and DataCollatorForPreference, with a tokenizer and a tiny model built here (no model hub)."""

from __future__ import annotations

import copy
import json
import os
import re
import time
from itertools import islice, permutations
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HTTP_TIMEOUT_S, require, run_cli
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from test_export import make_run
from workerkit import wait_for

from synthwatch.export.pairs import Sample, rank_pairs
from synthwatch.quality import verdicts as vd

CHECK = "verify_exact"
# per prompt: the verdict of each sample (p pass, f fail, . pending)
PLAN = ["pfpf", "pppp", "ffff", "p..p", "fpff", "fp"]
# and what a prompt without pairs is counted under
WHY = {1: "no_fail", 2: "no_pass", 3: "pending"}
ANSWER = re.compile(r"\*\*(-?\d+)\*\*")


def k_sample_records() -> list[dict[str, Any]]:
    recs = []
    for p, states in enumerate(PLAN):
        for s, state in enumerate(states):
            right = state != "f"
            recs.append({"prompt_idx": p, "sample_index": s, "source_id": f"q{p}",
                         "prompt_json": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": f"What is {p} + 1?"}],
                         "reasoning": f"Sample {s}: {p} plus one is {p + 1 if right else p + 2}.",
                         "content": f"It is **{p + 1 if right else p + 2}**."})
    # a passing sample flagged bad by a person: the export's own exclusions apply before pairing
    recs.append({"prompt_idx": 1, "sample_index": 9, "source_id": "q1", "review": "bad",
                 "prompt_json": [{"role": "user", "content": "What is 1 + 1?"}], "content": "It is **3**."})
    return recs


def correct(prompt: list[dict[str, Any]], answer: dict[str, Any]) -> bool:
    a = int(re.findall(r"\d+", prompt[-1]["content"])[0])
    return int(ANSWER.findall(answer["content"])[-1]) == a + 1


@pytest.fixture
def k_run(engine: Any) -> tuple[int, list[dict[str, Any]]]:
    drawn = k_sample_records()
    run_id = make_run(engine, drawn, tokenizer=None, snapshot_extra={
        "checks": {"verifiers": [{"kind": "exact", "answer_regex": ANSWER.pattern}]}})  # its verifier: verify_exact
    with engine.begin() as conn:  # the k samples of a prompt, as a run with samples_per_prompt stores them
        conn.exec_driver_sql("UPDATE record SET prompt_idx = ?, sample_index = ? WHERE run_id = ? AND idx = ?",
                             [(r["prompt_idx"], r["sample_index"], run_id, i) for i, r in enumerate(drawn)])
    with engine.connect() as conn:
        recs = [dict(r) for r in conn.exec_driver_sql(
            "SELECT id, prompt_idx, sample_index, content, review FROM record WHERE run_id = ? ORDER BY id",
            (run_id,)).mappings()]
    states = {(p, s): st_ for p, row in enumerate(PLAN) for s, st_ in enumerate(row)}
    with engine.begin() as conn:
        vd.mark_pending(conn, run_id, [r["id"] for r in recs], [CHECK])
        vd.append(conn, [vd.NewVerdict(run_id, r["id"], CHECK, vd.Verdict(
            "pass" if f"**{r['prompt_idx'] + 1}**" in r["content"] else "fail",
            score=(0.9 - 0.1 * r["sample_index"]) if "**" in r["content"] else None))
            for r in recs if states.get((r["prompt_idx"], r["sample_index"])) != "."])
    return run_id, recs


def export(db_path: Path, out: Path, *flags: str) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    res = run_cli("export", "exp", "--db", str(db_path), "--pairs", "--out", str(out), "--quiet", *flags, check=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return rows, json.loads(Path(f"{out}.manifest.json").read_text()), res.stdout


def test_pairs_are_a_pass_and_a_fail_of_one_prompt_at_most_p_per_prompt(db_path, tmp_path, k_run) -> None:  # type: ignore[no-untyped-def]
    run_id, recs = k_run
    rows, manifest, stdout = export(db_path, tmp_path / "pairs.jsonl", "--pairs-per-prompt", "2")
    # prompt 0 (pfpf): two pairs sharing no sample; 4 (fpff) and 5 (fp): one passing sample, so 2 and 1 pairs
    # failing samples rank worst score first (sample s scores 0.9 - 0.1 s): prompt 0 pairs s0 with s3, s2 with s1
    assert [r["id"] for r in rows] == ["q0>q0#s3", "q0#s2>q0#s1", "q4#s1>q4#s3", "q4#s1>q4#s2", "q5#s1>q5"]
    for row in rows:
        assert row["prompt"][-1]["role"] == "user" and [m["role"] for m in row["chosen"] + row["rejected"]] == [
            "assistant", "assistant"]
        # never two passing or two failing samples: the chosen answer is right, the rejected one wrong
        assert correct(row["prompt"], row["chosen"][0]) and not correct(row["prompt"], row["rejected"][0])
        assert row["chosen"][0]["reasoning_content"].startswith("Sample ")  # the reasoning kept, as templates read it
        assert row["pair"]["check"] == CHECK and row["pair"]["chosen"]["record"] != row["pair"]["rejected"]["record"]
    pairs = manifest["pairs"]
    assert manifest["format"] == "pairs" and manifest["counts"]["exported"] == 5 == pairs["pairs_written"]
    assert pairs["prompts"] == 6 and pairs["prompts_with_pairs"] == 3
    assert pairs["prompts_without_pairs"] == {"pending": 1, "no_pass": 1, "no_fail": 1, "no_score": 0,
                                              "no_margin": 0}
    assert pairs["prompts_without_pairs_examples"] == {why: [p] for p, why in WHY.items()}
    assert pairs["records_lacking_verdict"] == 2 and manifest["counts"]["excluded"]["no_verdict"] == 2
    assert manifest["counts"]["excluded"]["flagged_bad"] == 1  # the flagged sample is in no pair
    assert "pairs by verify_exact: 5 from 3 of 6 prompts" in stdout and "pending 1" in stdout
    # deterministic: the same verdicts give the same file
    again, _m, _o = export(db_path, tmp_path / "again.jsonl", "--pairs-per-prompt", "2")
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "pairs.jsonl").read_bytes()
    one, m1, _o = export(db_path, tmp_path / "one.jsonl")
    assert [r["id"] for r in one] == ["q0>q0#s3", "q4#s1>q4#s3", "q5#s1>q5"] and m1["pairs"]["pairs_per_prompt"] == 1


def test_pair_margin_on_scores(db_path, tmp_path, k_run) -> None:  # type: ignore[no-untyped-def]
    """Scores: sample s scores 0.9 - 0.1 s. Prompt 0: passing s0 (0.9), s2 (0.7), failing s1 (0.8), s3 (0.6)."""
    rows, manifest, _o = export(db_path, tmp_path / "m.jsonl", "--pair-margin", "0.25", "--pairs-per-prompt", "3")
    # only s0 > s3 by 0.3 reaches the margin in prompt 0; prompt 4: s1 (0.8) over s3 (0.6) by 0.2 falls short
    assert [r["id"] for r in rows] == ["q0>q0#s3"]
    assert rows[0]["pair"]["chosen"]["score"] - rows[0]["pair"]["rejected"]["score"] >= 0.25
    assert manifest["pairs"]["prompts_without_pairs"]["no_margin"] == 2 and manifest["pairs"]["margin"] == 0.25


def test_pair_options_are_checked_before_anything_is_written(db_path, tmp_path, k_run) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "x.jsonl"
    for flags, says in [(["--pairs", "--select", "passing"], "drop --select"),
                        (["--pairs", "--format", "messages"], "drop --format"),
                        (["--pairs", "--turns", "all"], "--turns last"),
                        (["--format", "messages", "--pair-margin", "0.2"], "go with --pairs"),
                        (["--pairs", "--require-pass"], "drop --require-pass"),
                        (["--pairs", "--select-check", "nosuch"], "unknown check 'nosuch' (--select-check)"),
                        (["--pairs", "--select-check", "verify_exat"], "did you mean 'verify_exact'"),
                        (["--pairs", "--where", "verify_exact=maybe"], "verify_exact"),
                        (["--pairs", "--exclude-check", "jugde"], "unknown check 'jugde'")]:
        res = run_cli("export", "exp", "--db", str(db_path), "--out", str(out), *flags)
        assert res.returncode == 2 and says in res.stderr, (flags, res.stderr)
        assert not out.exists()


def test_pairs_take_their_checks_and_candidates_through_the_catalogue(engine, db_path, tmp_path, k_run) -> None:  # type: ignore[no-untyped-def]
    """#38: the pairing check is any name of the run's catalogue (an alias, a stored judge), repeated ones combine
    with AND, and --where / --exclude-check restrict the candidate samples (counted under their own reasons)."""
    run_id, recs = k_run
    # the judge fails prompt 0's sample 0 (the verifier's best passing sample) and passes every other sample
    with engine.begin() as conn:
        vd.append(conn, [vd.NewVerdict(run_id, r["id"], "judge", vd.Verdict(
            "fail" if (r["prompt_idx"], r["sample_index"]) == (0, 0) else "pass")) for r in recs])
    base, _m, _o = export(db_path, tmp_path / "base.jsonl", "--select-check", "verify:exact")
    assert [r["id"] for r in base] == ["q0>q0#s3", "q4#s1>q4#s3", "q5#s1>q5"]
    assert base[0]["pair"]["check"] == CHECK  # the alias resolved to the catalogue's name
    # --where leaves prompt 0's sample 0 out of every pair: prompt 0 pairs its next passing sample
    rows, manifest, _o = export(db_path, tmp_path / "where.jsonl", "--where", "judge!=fail")
    assert [r["id"] for r in rows] == ["q0#s2>q0#s3", "q4#s1>q4#s3", "q5#s1>q5"]
    assert manifest["counts"]["excluded"]["where"] == 1 and manifest["selection"]["expression"] == "not judge=fail"
    rows, manifest, _o = export(db_path, tmp_path / "excl.jsonl", "--exclude-check", "judge")
    assert [r["id"] for r in rows] == ["q0#s2>q0#s3", "q4#s1>q4#s3", "q5#s1>q5"]
    assert manifest["counts"]["excluded"]["check:judge"] == 1
    # two checks, AND: prompt 0's sample 0 now fails (the judge), so it is a rejected candidate, ranked by the first
    # check's score (0.9): the worst-scored failing sample, s3, is still the rejected one
    rows, manifest, _o = export(db_path, tmp_path / "and.jsonl", "--select-check", "verify_exact",
                                "--select-check", "judge")
    assert [r["id"] for r in rows] == ["q0#s2>q0#s3", "q4#s1>q4#s3", "q5#s1>q5"]
    assert rows[0]["pair"]["check"] == "verify_exact and judge"
    # the judge alone: only prompt 0 has a failing sample, and no prompt is pending (every sample has a verdict)
    rows, manifest, _o = export(db_path, tmp_path / "judge.jsonl", "--select-check", "judge")
    assert [r["id"] for r in rows] == ["q0#s1>q0"] and manifest["pairs"]["prompts_without_pairs"]["pending"] == 0
    assert manifest["pairs"]["check"] == "judge"


def alarm(engine: Any, run_id: int, rule: str) -> int:
    with engine.begin() as conn:
        return int(conn.execute(text(
            "INSERT INTO alarm (run_id, rule, severity, title, message, count, raised_at, updated_at, active,"
            " auto_paused) VALUES (:r, :rule, 'error', 'alarm', 'm', 3, :t, :t, true, false) RETURNING id"),
            {"r": run_id, "rule": rule, "t": time.time()}).scalar_one())


def test_open_alarms_and_the_api(engine, db_path, tmp_path, k_run, live_app) -> None:  # type: ignore[no-untyped-def]
    """The pair check's own alarm does not hold a pairs export (its failing samples are the rejected side); any other
    open alarm does, as for every export; the dashboard's API writes the same pairs."""
    run_id, _recs = k_run
    alarm(engine, run_id, CHECK)
    out = tmp_path / "p.jsonl"
    rows, manifest, _o = export(db_path, out)
    assert len(rows) == 3 and manifest["confirmed_with_open_alarms"] is False
    held = run_cli("export", "exp", "--db", str(db_path), "--format", "messages", "--out", str(tmp_path / "m.jsonl"))
    assert held.returncode == 2 and "--allow-open-alarms" in held.stderr  # the same alarm holds an export of all
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as c:
        r = c.post(f"/api/runs/{run_id}/exports", json={"format": "pairs"})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        job = wait_for(lambda: (j := c.get(f"/api/runs/{run_id}/exports/{job_id}").json())["status"] != "running"
                       and j, timeout_s=60, what="the export to finish")
        assert job["status"] == "done", job
        assert job["manifest"]["pairs"]["pairs_written"] == 3 and job["manifest"]["file"]["sha256"] == manifest[
            "file"]["sha256"]  # the same bytes as the command's
        alarm(engine, run_id, "repetition")  # another check's alarm holds the pairs too
        assert c.post(f"/api/runs/{run_id}/exports", json={"format": "pairs"}).status_code == 409
    again = run_cli("export", "exp", "--db", str(db_path), "--pairs", "--out", str(tmp_path / "q.jsonl"))
    assert again.returncode == 2 and "repetition" in again.stderr


# ------------------------------------------------------------------------------------- TRL's own code


TEMPLATE = (  # Qwen3's rule, shortened: the last assistant turn renders its reasoning_content inside <think>
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and loop.last and m.reasoning_content is string %}<think>\n"
    "{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def trl_or_fail() -> Any:
    try:
        import trl
    except ImportError as exc:  # a missing trl fails under CI=true (conftest.require), never a quiet skip
        require(False, f"trl is not installed ({exc}); ./dev setup installs it (constraints.txt)")
    return trl


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>", "<think>", "</think>"])
    tok.chat_template = TEMPLATE
    return tok


def test_trl_reads_the_pairs(db_path, tmp_path, k_run, tokenizer) -> None:  # type: ignore[no-untyped-def]
    trl_or_fail()
    from datasets import load_dataset
    from trl.data_utils import extract_prompt, is_conversational, maybe_apply_chat_template, maybe_extract_prompt

    out = tmp_path / "pairs.jsonl"
    rows, _m, _o = export(db_path, out, "--pairs-per-prompt", "2")
    ds = load_dataset("json", data_files=str(out), split="train")
    assert ds.num_rows == len(rows) == 5
    assert {"prompt", "chosen", "rejected"} <= set(ds.column_names)
    for ex, row in zip(ds, rows, strict=True):
        assert is_conversational(ex)
        assert maybe_extract_prompt(ex)["prompt"] == ex["prompt"]  # an explicit prompt: TRL leaves it
        # TRL splits an implicit-prompt row (whole conversations) into exactly this prompt and these answers
        implicit = extract_prompt({"chosen": ex["prompt"] + ex["chosen"], "rejected": ex["prompt"] + ex["rejected"]})
        assert implicit["prompt"] == ex["prompt"] and implicit["chosen"] == ex["chosen"]
        text = maybe_apply_chat_template(ex, tokenizer)
        assert text["prompt"].endswith("<|im_start|>user\nWhat is " + re.findall(r"\d+", row["id"])[0]
                                       + " + 1?<|im_end|>\n<|im_start|>assistant\n")
        for side in ("chosen", "rejected"):  # the reasoning reaches the trained text, then the answer
            msg = row[side][0]
            assert text[side] == f"<think>\n{msg['reasoning_content']}\n</think>\n\n{msg['content']}<|im_end|>\n"

    # --think-inline: the reasoning between the run's think strings in the content, for templates without the key
    inline = tmp_path / "inline.jsonl"
    rows, m, _o = export(db_path, inline, "--think-inline")
    assert m["pairs"]["reasoning"].startswith("inline")
    ex = load_dataset("json", data_files=str(inline), split="train")[0]
    assert "reasoning_content" not in ex["chosen"][0]
    plain = tokenizer.apply_chat_template(ex["prompt"] + ex["chosen"], tokenize=False)
    assert "<think>Sample 0: 0 plus one is 1.</think>It is **1**.<|im_end|>" in plain


def test_the_dpo_trainer_tokenizes_and_collates_the_pairs(db_path, tmp_path, k_run, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The DPO trainer's own preprocessing (prompt_ids, chosen_ids, rejected_ids) and DataCollatorForPreference,
    on CPU with a one-layer model built here, then one training step."""
    trl_or_fail()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from datasets import load_dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    out = tmp_path / "pairs.jsonl"
    rows, _m, _o = export(db_path, out, "--pairs-per-prompt", "2")
    ds = load_dataset("json", data_files=str(out), split="train")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), per_device_train_batch_size=5, max_steps=1, report_to="none",
                     use_cpu=True, logging_steps=1, save_strategy="no", dataset_num_proc=None)
    trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=ds,
                         processing_class=tokenizer)
    tokenized = trainer.train_dataset
    for ex, row in zip(tokenized, rows, strict=True):
        prompt = tokenizer.decode(ex["prompt_ids"])
        assert prompt.endswith("<|im_start|>assistant\n")
        for side in ("chosen", "rejected"):
            msg = row[side][0]
            assert tokenizer.decode(ex[f"{side}_ids"]) == (
                f"<think>\n{msg['reasoning_content']}\n</think>\n\n{msg['content']}<|im_end|>\n")
    batch = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id)([dict(ex) for ex in tokenized])
    assert batch["input_ids"].shape[0] == 2 * len(rows)  # chosen then rejected
    first = tokenized[0]
    n_prompt, n_chosen = len(first["prompt_ids"]), len(first["chosen_ids"])
    assert batch["completion_mask"][0].tolist()[: n_prompt + n_chosen] == [0] * n_prompt + [1] * n_chosen
    result = trainer.train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))


# ------------------------------------------------------------------------------------ the pairing rule


samples_st = st.lists(st.tuples(st.booleans(), st.none() | st.floats(0, 1)), min_size=0, max_size=8)


@given(samples_st, st.integers(1, 6), st.none() | st.floats(0, 1))
def test_rank_pairs_rules(drawn: list[tuple[bool, float | None]], per_prompt: int, margin: float | None) -> None:
    samples = [Sample(100 + i, i, passed, score) for i, (passed, score) in enumerate(drawn)]
    pairs, why = rank_pairs(samples, per_prompt, margin)
    valid = {(c.id, r.id) for c in samples for r in samples if c.passed and not r.passed and (
        margin is None or (c.score is not None and r.score is not None and c.score - r.score >= margin))}
    got = [(c.id, r.id) for c, r in pairs]
    assert len(got) == len(set(got)) == min(per_prompt, len(valid))  # as many as allowed, none twice
    assert set(got) <= valid  # a passing chosen, a failing rejected, the margin met
    assert bool(pairs) != bool(why) and (why in ("no_pass", "no_fail", "no_score", "no_margin") or not why)
    # the order the samples come in changes nothing
    for other in islice(permutations(reversed(samples)), 6):
        assert [(c.id, r.id) for c, r in rank_pairs(list(other), per_prompt, margin)[0]] == got
