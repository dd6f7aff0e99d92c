"""Near-duplicates scoped by prompt, shingled by script, and checked against an existing dataset (#38 item 8).

Real `synthwatch run` processes against the simulator (an ``ECHO:`` prompt is answered with its own text, so the
answers are exactly the texts chosen here), a real SQLite file, real JSONL and Parquet files. Before #38 a Chinese
paragraph with two small word edits was not a near-duplicate (word shingles over a script without spaces: a
similarity of 0.27 against 0.70 for English), and a prompt's own k samples failed each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from synthwatch.check_extended import NearDuplicateSettings
from synthwatch.store.db import open_engine

pytestmark = pytest.mark.slow  # real runs with their check threads

ZH = ("天空之所以呈现蓝色，是因为太阳光进入大气层后，与空气中的气体分子发生碰撞。波长较短的蓝光比波长较长的红光更容易"
      "被散射，这种现象被称为瑞利散射。因此，无论我们朝哪个方向看，都会看到被散射的蓝光，天空便显得格外湛蓝。")
ZH_EDITED = ZH.replace("因此", "所以").replace("格外", "非常")  # two small word edits
ZH_OTHER = ("长城是中国古代的军事防御工程，东起山海关，西至嘉峪关，绵延数千公里。它修建于不同的朝代，其中明长城保存得最为完整，"
            "如今已成为世界文化遗产和著名的旅游景点，每年吸引大量游客前来参观。")
EN = ("The sky looks blue because air molecules scatter short blue wavelengths of sunlight far more "
      "strongly than the longer red wavelengths, so blue light reaches our eyes from every direction.")
EN_EDITED = EN.replace("far more strongly", "much more strongly").replace("every direction", "all directions")
MIXED = ("在 Python 中，list 是可变的序列类型，而 tuple 是不可变的；如果你需要一个可以修改的容器，应该使用 list，否则可以"
         "选择 tuple 来保证数据不会被意外修改。")
MIXED_EDITED = MIXED.replace("容器", "集合").replace("意外", "无意中")
GREAT_WALL_EN = ("The Great Wall is an ancient defensive structure stretching thousands of kilometres across the "
                 "north of China, built and rebuilt over many dynasties.")


def _settings(**kw: Any) -> NearDuplicateSettings:
    return NearDuplicateSettings.model_validate({"enabled": True, **kw})


# ------------------------------------------------------------------------------------------ shingles


def test_two_small_edits_give_comparable_similarity_in_chinese_and_english() -> None:
    from synthwatch.quality.neardup import Signer, jaccard, shingles

    s = _settings()
    zh, en, mixed = jaccard(ZH, ZH_EDITED, s), jaccard(EN, EN_EDITED, s), jaccard(MIXED, MIXED_EDITED, s)
    assert 0.6 <= en <= 0.8, en
    assert zh >= 0.6 and abs(zh - en) <= 0.25, (zh, en)  # character shingles for Han
    assert mixed >= 0.6, mixed  # Latin words and Han characters in one text
    assert jaccard(ZH, ZH_OTHER, s) < 0.1 and jaccard(ZH, EN, s) == 0.0
    assert jaccard(ZH, ZH_EDITED, _settings(shingling="words")) < 0.35  # what word shingles alone gave (#38)
    # the same with the MinHash estimate the index uses
    sig = Signer(s)
    assert sig.signature(ZH).jaccard(sig.signature(ZH_EDITED)) >= 0.6
    # Thai and Japanese are written without spaces too; Korean (Hangul) with spaces stays in words
    assert {b.decode() for b in shingles("ภาษาไทย", 3)} >= {"ภ า ษ"}
    assert {b.decode() for b in shingles("今日は良い天気です", 3)} >= {"今 日 は", "天 気 で"}
    assert shingles("한국어 문장은 띄어쓰기를 합니다", 3) == {"한국어 문장은 띄어쓰기를".encode(), "문장은 띄어쓰기를 합니다".encode()}


# every Unicode category, lone surrogates (Cs) included: a stored text never has one, a shingle must not raise anyway
ANY_TEXT = st.text(alphabet=st.characters(categories=("L", "M", "N", "P", "S", "Z", "C")), max_size=300)


@given(st.one_of(ANY_TEXT, st.sampled_from([ZH, MIXED, "\ud800" + ZH, "ภาษาไทย"])),
       st.sampled_from(["auto", "words", "chars"]), st.integers(1, 5))
def test_shingling_never_raises_and_a_text_is_its_own_duplicate(t: str, mode: str, k: int) -> None:
    from synthwatch.quality.neardup import Signer, jaccard, shingles

    s = _settings(shingling=mode, shingle_size=k)
    got = shingles(t, k, mode)  # any code point, lone surrogates included
    assert all(isinstance(x, bytes) for x in got)
    assert jaccard(t, t, s) == 1.0
    if got:
        sig = Signer(s)
        assert sig.signature(t).jaccard(sig.signature(t)) == 1.0


@given(st.lists(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=60, max_size=200, unique=True)
       .map("".join), st.data())
def test_one_changed_character_keeps_a_chinese_text_a_near_duplicate(t: str, data: st.DataObject) -> None:
    """Han text of 60 or more distinct characters with one character replaced: at most 3 of its character
    3-shingles go and 3 come, whatever the text (word shingles would see one changed "word": the whole text)."""
    from synthwatch.quality.neardup import jaccard

    i = data.draw(st.integers(0, len(t) - 1))
    edited = t[:i] + ("日" if t[i] != "日" else "月") + t[i + 1:]
    assert jaccard(t, edited, _settings()) >= 0.85


# ------------------------------------------------------------------------------------------ real runs


def _dataset(path: Path, texts: list[str]) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": "ECHO:" + t}]},
                                ensure_ascii=False) + "\n")
    return path


def _run(tmp_path: Path, url: str, db: Path, name: str, data: Path, checks: str, *extra: str) -> Any:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(checks)
    return run_cli("run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
                   "--name", name, "--concurrency", "1", "--quiet", "--no-preflight", "--config", str(cfg), *extra)


def _verdicts(db: Path, name: str) -> dict[tuple[int, int, str], tuple[str, str]]:
    """(prompt, sample, check) -> (state, reason) of the verdicts in force of the run's near-duplicate checks."""
    engine = open_engine(str(db))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT r.prompt_idx, r.sample_index, v.check_name, v.state, v.reason FROM check_verdict v"
                " JOIN record r ON r.id = v.record_id JOIN run ON run.id = r.run_id WHERE run.name = :n"
                " AND v.check_name LIKE 'near_duplicate%' AND NOT EXISTS (SELECT 1 FROM check_verdict w"
                " WHERE w.record_id = v.record_id AND w.check_name = v.check_name AND w.id > v.id)"), {"n": name}).all()
    finally:
        engine.dispose()
    return {(p, s, c): (state, reason or "") for p, s, c, state, reason in rows}


def test_a_chinese_near_duplicate_is_caught(tmp_path: Path, sim: Any) -> None:
    """The #38 report: a Chinese answer with two small word edits passed near_duplicate (word shingles over a script
    without spaces: similarity 0.27); with character shingles it fails, naming the first answer's record; an
    unrelated Chinese answer and a near-duplicate in mixed Chinese and English text are told apart too."""
    url = sim(seed=2)
    data = _dataset(tmp_path / "zh.jsonl", [ZH, ZH_EDITED, ZH_OTHER, MIXED, MIXED_EDITED])
    db = tmp_path / "zh.db"
    proc = _run(tmp_path, url, db, "zh", data, "[checks.near_duplicate]\nenabled = true\nthreshold = 0.6\n")
    assert proc.returncode == 0, proc.stderr
    got = _verdicts(db, "zh")
    assert [got[p, 0, "near_duplicate"][0] for p in range(5)] == ["pass", "fail", "pass", "pass", "fail"], got
    assert "(prompt 0)" in got[1, 0, "near_duplicate"][1] and "(prompt 3)" in got[4, 0, "near_duplicate"][1]


CHECKS = """
[checks.near_duplicate]
enabled = true
within_prompt = true
threshold = 0.6
"""


def test_across_prompts_by_default_and_within_a_prompt_as_its_own_check(tmp_path: Path, sim: Any) -> None:
    """k = 2 samples of 4 prompts (each sample echoes its prompt: the two samples of a prompt are equal). The Chinese
    paragraph edited twice is a near-duplicate of the first prompt's answers (caught: character shingles); a prompt's
    own samples do not fail near_duplicate but fail near_duplicate_in_prompt (sample 1 repeats sample 0)."""
    url = sim(seed=3)
    data = _dataset(tmp_path / "p.jsonl", [ZH, ZH_EDITED, EN, ZH_OTHER])
    db = tmp_path / "nd.db"
    proc = _run(tmp_path, url, db, "scoped", data, CHECKS, "--samples-per-prompt", "2")
    assert proc.returncode == 0, proc.stderr
    got = _verdicts(db, "scoped")
    assert len(got) == 16, got
    across = {(p, s): got[p, s, "near_duplicate"][0] for p in range(4) for s in range(2)}
    assert across == {(0, 0): "pass", (0, 1): "pass", (1, 0): "fail", (1, 1): "fail", (2, 0): "pass",
                      (2, 1): "pass", (3, 0): "pass", (3, 1): "pass"}, got
    assert "(prompt 0)" in got[1, 0, "near_duplicate"][1]
    within = {(p, s): got[p, s, "near_duplicate_in_prompt"][0] for p in range(4) for s in range(2)}
    assert within == {(p, s): "fail" if s else "pass" for p in range(4) for s in range(2)}, got
    assert "an earlier sample of the same prompt" in got[2, 1, "near_duplicate_in_prompt"][1]
    # each is its own check with its own rate and rule
    page = run_cli("checks", "scoped", "--db", str(db))
    assert "near_duplicate_in_prompt" in page.stdout + page.stderr, page


EXISTING = [  # an earlier dataset: chats whose last assistant message is the text
    {"messages": [{"role": "user", "content": "Why is the sky blue?"}, {"role": "assistant", "content": ZH_EDITED}]},
    {"messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": GREAT_WALL_EN}]},
]


def _existing_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _index_files(db: Path) -> list[Path]:
    return sorted(db.parent.glob(f"{db.name}.dedup-*.idx"))


AGAINST = """
[checks.near_duplicate]
threshold = 0.6
"""


def test_dedup_against_a_jsonl_dataset_index_built_once_and_rebuilt_when_the_file_changes(tmp_path: Path,
                                                                                          sim: Any) -> None:
    url = sim(seed=4)
    data = _dataset(tmp_path / "p.jsonl", [ZH, EN, ZH_OTHER])
    old = _existing_jsonl(tmp_path / "old.jsonl", EXISTING)
    db = tmp_path / "d.db"
    first = _run(tmp_path, url, db, "d1", data, AGAINST, "--dedup-against", str(old))
    assert first.returncode == 0, first.stderr
    assert f"dedup index of {old}: built" in first.stderr, first.stderr
    got = _verdicts(db, "d1")
    assert got[0, 0, "near_duplicate"][0] == "fail", got
    assert f"row 1 of {old}" in got[0, 0, "near_duplicate"][1]
    assert got[1, 0, "near_duplicate"][0] == "pass" and got[2, 0, "near_duplicate"][0] == "pass", got
    [idx] = _index_files(db)
    stamp = (idx.stat().st_ino, idx.stat().st_mtime_ns)
    # `checks --recompute` builds the run's index again with the file's rows, from the index kept beside the database
    again = run_cli("checks", "d1", "--db", str(db), "--recompute")
    assert again.returncode == 0, again.stderr
    assert _verdicts(db, "d1")[0, 0, "near_duplicate"][0] == "fail"
    assert (idx.stat().st_ino, idx.stat().st_mtime_ns) == stamp
    # a second run over the same file and settings: the index is found whole, not built again
    second = _run(tmp_path, url, db, "d2", data, AGAINST, "--dedup-against", str(old))
    assert second.returncode == 0, second.stderr
    assert "found whole" in second.stderr and "built" not in second.stderr, second.stderr
    assert (idx.stat().st_ino, idx.stat().st_mtime_ns) == stamp and _index_files(db) == [idx]
    assert _verdicts(db, "d2")[0, 0, "near_duplicate"][0] == "fail"
    # the file changes: its index is built again (and the new row is seen)
    _existing_jsonl(old, [*EXISTING, {"completion": EN_EDITED}])
    third = _run(tmp_path, url, db, "d3", data, AGAINST, "--dedup-against", str(old))
    assert third.returncode == 0 and f"dedup index of {old}: built" in third.stderr, third.stderr
    assert _verdicts(db, "d3")[1, 0, "near_duplicate"][0] == "fail"
    assert f"row 3 of {old}" in _verdicts(db, "d3")[1, 0, "near_duplicate"][1]
    # a corrupt index (a flipped byte) is never trusted: built again
    raw = bytearray(idx.read_bytes())
    raw[-5] ^= 0xFF
    idx.write_bytes(bytes(raw))
    fourth = _run(tmp_path, url, db, "d4", data, AGAINST, "--dedup-against", str(old))
    assert fourth.returncode == 0 and "built" in fourth.stderr, fourth.stderr
    # other shingling settings: built again
    fifth = _run(tmp_path, url, db, "d5", data, AGAINST + "shingle_size = 4\n", "--dedup-against", str(old))
    assert fifth.returncode == 0 and "built" in fifth.stderr, fifth.stderr
    assert not list(tmp_path.glob("*.tmp-*")) and not list(tmp_path.glob("*.new-*"))


def test_dedup_against_a_parquet_dataset(tmp_path: Path, sim: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    url = sim(seed=5)
    data = _dataset(tmp_path / "p.jsonl", [EN, MIXED_EDITED, ZH_OTHER])
    old = tmp_path / "old.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "response": [GREAT_WALL_EN, MIXED, None]}), old)
    db = tmp_path / "pq.db"
    cfg = AGAINST + 'against_column = "response"\n'
    proc = _run(tmp_path, url, db, "pq", data, cfg, "--dedup-against", str(old))
    assert proc.returncode == 0, proc.stderr
    got = _verdicts(db, "pq")
    assert [got[p, 0, "near_duplicate"][0] for p in range(3)] == ["pass", "fail", "pass"], got
    assert f"row 2 of {old}" in got[1, 0, "near_duplicate"][1]


@pytest.mark.parametrize("case", ["missing", "bad_row", "unknown_column", "not_text", "parquet_column"])
def test_bad_dedup_input_is_one_line_and_exit_2(case: str, tmp_path: Path, sim: Any) -> None:
    url = sim(seed=6)
    data = _dataset(tmp_path / "p.jsonl", [EN])
    old = tmp_path / "old.jsonl"
    cfg, want = AGAINST, ""
    if case == "missing":
        want = f"{old}: no such file"
    elif case == "bad_row":
        old.write_text(json.dumps({"text": EN}) + "\n" + json.dumps({"text": ZH}) + "\n{not json\n")
        want = f"{old} line 3: not JSON"
    elif case == "unknown_column":
        old.write_text(json.dumps({"text": EN, "id": 1}) + "\n")
        cfg += 'against_column = "answer_text"\n'
        want = f"{old} line 1: no column 'answer_text'; its columns: text, id"
    elif case == "not_text":
        old.write_text(json.dumps({"text": EN}) + "\n" + json.dumps({"text": 42}) + "\n")
        want = f"{old} line 2: column 'text' is int, not text"
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        old = tmp_path / "old.parquet"
        pq.write_table(pa.table({"prompt": ["a"], "score": [1.0]}), old)
        want = f"{old} row 1: no text column"
    db = tmp_path / "bad.db"
    proc = _run(tmp_path, url, db, "bad", data, cfg, "--dedup-against", str(old))
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and want in lines[0], proc.stderr
    assert not db.exists() and not list(tmp_path.glob("*.idx*"))  # nothing written: no database, no index


def test_the_dashboard_cannot_set_a_dedup_file(tmp_path: Path, sim: Any, live_app: Any, db_path: Path) -> None:
    """The settings policy refuses checks.near_duplicate.against from the dashboard's API (a file on the worker's
    machine), through both routes that take check settings; the other near-duplicate settings, the new ones
    included, are settable there."""
    import httpx

    data = _dataset(tmp_path / "p.jsonl", [EN])
    proc = _run(tmp_path, sim(seed=7), db_path, "mine", data, "")
    assert proc.returncode == 0, proc.stderr
    old = _existing_jsonl(tmp_path / "old.jsonl", EXISTING)
    srv = live_app()
    headers = {"Sec-Fetch-Site": "same-origin", "Origin": srv.url}

    def post(path: str, body: Any) -> httpx.Response:
        return httpx.post(f"{srv.url}{path}", json=body, headers=headers, timeout=30)

    r = post("/api/runs/1/checks/settings", {"near_duplicate": {"enabled": True, "against": str(old)}})
    assert r.status_code == 400 and r.json()["refused"] == ["checks.near_duplicate.against"], r.text
    assert "--dedup-against" in r.json()["detail"], r.text
    r = post("/api/runs/1/settings", {"changes": {"checks.near_duplicate.against": str(old)}})
    assert r.status_code == 400 and r.json()["refused"] == ["checks.near_duplicate.against"], r.text
    engine = open_engine(str(db_path))
    try:
        with engine.connect() as conn:
            cfg = json.loads(conn.execute(text("SELECT config_json FROM run WHERE id = 1")).scalar_one())
        assert "against" not in (cfg.get("checks") or {}).get("near_duplicate", {}), cfg
        r = post("/api/runs/1/checks/settings", {"near_duplicate": {"enabled": True, "within_prompt": True,
                                                                    "shingling": "chars", "shingle_size": 4}})
        assert r.status_code == 200, r.text
        with engine.connect() as conn:
            cfg = json.loads(conn.execute(text("SELECT config_json FROM run WHERE id = 1")).scalar_one())
        assert cfg["checks"]["near_duplicate"]["within_prompt"] is True, cfg
    finally:
        engine.dispose()


def test_the_index_is_built_from_a_stream_in_bounded_memory(tmp_path: Path) -> None:
    """A 7 MB JSONL file (1,000 rows of 7 KB, 1,200 words each) is indexed with under 4 MB of Python memory at its peak: rows are read
    one at a time and signatures written per batch, never the file held whole (tracemalloc counts every allocation
    of the interpreter's; the libraries are imported first). The index then reads back whole with every row."""
    import random
    import tracemalloc

    import datasketch  # noqa: F401 - its import (scipy) is not the index's memory

    from synthwatch.quality.dedup_index import ensure, load

    rng = random.Random(1)
    words = [f"w{i}" for i in range(5000)]
    src = tmp_path / "big.jsonl"
    with src.open("w") as fh:
        for _ in range(1000):
            fh.write(json.dumps({"text": " ".join(rng.choices(words, k=1200))}) + "\n")
    size = src.stat().st_size
    assert size > 6_000_000
    s = _settings(against=str(src))
    db_url = f"sqlite:///{tmp_path / 'big.db'}"
    tracemalloc.start()
    try:
        idx, built = ensure(db_url, s)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert built and idx.parent == tmp_path
    assert peak < 4_000_000 < size, (peak, size)  # a batch's signatures and a 1 MB read buffer, not the file
    rows, values = load(db_url, s)
    assert len(rows) == 1000 and values.shape == (1000, 64) and list(rows[:3]) == [1, 2, 3]


def test_a_postgresql_database_keeps_the_index_in_the_cache_folder(tmp_path: Path, monkeypatch: Any) -> None:
    """No database file to sit beside: the index goes under $XDG_CACHE_HOME/synthwatch/dedup, one per database and
    file, found whole the second time; the password in the URL is not in its name."""
    from synthwatch.quality.dedup_index import ensure

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    old = _existing_jsonl(tmp_path / "old.jsonl", EXISTING)
    url = "postgresql+psycopg://sw:s3cret-pw@127.0.0.1:5432/synthwatch"
    idx, built = ensure(url, _settings(against=str(old)))
    assert built and idx.parent == tmp_path / "cache" / "synthwatch" / "dedup" and "s3cret" not in idx.name
    assert ensure(url, _settings(against=str(old))) == (idx, False)
    other, built = ensure(url.replace("/synthwatch", "/other"), _settings(against=str(old)))
    assert built and other != idx
