"""Prompt loading: shapes, bad-line reporting, Parquet, HF save_to_disk folders, gzip."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from synthwatch.config import DatasetConfig
from synthwatch.sources.datasets import BadLine, DatasetError, Prompt, iter_dataset, load_dataset


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Rows that are ``str`` or ``bytes`` are written verbatim; anything else as JSON."""
    out = bytearray()
    for row in rows:
        if isinstance(row, bytes):
            out += row
        elif isinstance(row, str):
            out += row.encode()
        else:
            out += json.dumps(row).encode()
        out += b"\n"
    path.write_bytes(bytes(out))
    return path


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


PERFECTBLEND_ROWS = [
    {
        "conversations": [
            {"from": "human", "value": "What is 2+2?"},
            {"from": "gpt", "value": "4"},
        ],
        "source": "metamath",
    },
    {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Name a colour."},
            {"from": "gpt", "value": "Red."},
            {"from": "human", "value": "Another?"},
            {"from": "gpt", "value": "Blue."},
        ],
        "source": "slimorca",
    },
]


# ---------------------------------------------------------------------------------------- shapes


def test_messages_shape(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {"id": "a", "messages": [user("hi")]},
            {
                "id": 7,
                "messages": [
                    {"role": "system", "content": "sys"},
                    user("q1"),
                    {"role": "assistant", "content": "a1", "reasoning_content": "dropped key"},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "part1"}, {"type": "text", "text": "p2"}],
                    },
                    {"role": "assistant", "content": "answer to be regenerated"},
                ],
            },
        ],
    )
    result = load_dataset(DatasetConfig(path=str(path)))
    assert result.shape == "messages"
    assert result.total_rows == 2
    assert result.bad_lines == []
    first, second = result.prompts
    assert first == Prompt(index=0, line=1, source_id="a", messages=[user("hi")])
    assert second.source_id == "7"
    assert second.messages == [
        {"role": "system", "content": "sys"},
        user("q1"),
        {"role": "assistant", "content": "a1"},
        user("part1\np2"),
    ]


def test_conversations_perfectblend_drops_trailing_gpt(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "pb.jsonl", PERFECTBLEND_ROWS)
    result = load_dataset(DatasetConfig(path=str(path)))
    assert result.shape == "conversations (ShareGPT)"
    assert [p.messages for p in result.prompts] == [
        [user("What is 2+2?")],
        [
            {"role": "system", "content": "Be brief."},
            user("Name a colour."),
            {"role": "assistant", "content": "Red."},
            user("Another?"),
        ],
    ]
    assert [p.source_id for p in result.prompts] == [None, None]


def test_conversations_specforge_role_content_keys(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "sf.jsonl",
        [
            {
                "id": "x1",
                "conversations": [
                    {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "hi", "reasoning_content": "..."},
                ],
            },
            {
                "idx": 3,
                "conversations": [{"from": "user", "value": "u"}, {"from": "assistant", "value": "a"}],
            },
        ],
    )
    result = load_dataset(DatasetConfig(path=str(path)))
    assert [p.messages for p in result.prompts] == [[user("hello")], [user("u")]]
    assert [p.source_id for p in result.prompts] == ["x1", "3"]


def test_prompt_shape_and_mixed(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"prompt": "one", "answer": "ignored"},
            {"prompt": "two"},
            {"messages": [user("three")]},
            {"prompt": [user("four")]},  # TRL conversational prompt
        ],
    )
    result = load_dataset(DatasetConfig(path=str(path)))
    assert [p.messages for p in result.prompts] == [
        [user("one")],
        [user("two")],
        [user("three")],
        [user("four")],
    ]
    assert result.shape == "mixed: prompt 3, messages 1"

    only_prompts = write_jsonl(tmp_path / "p2.jsonl", [{"prompt": "a"}])
    assert load_dataset(DatasetConfig(path=str(only_prompts))).shape == "prompt"


def test_question_is_not_guessed_but_can_be_mapped(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "why?", "answer": "because"}])
    with pytest.raises(DatasetError) as err:
        load_dataset(DatasetConfig(path=str(path)))
    assert "no 'messages', 'conversations' or 'prompt' field (keys: question, answer)" in str(err.value)
    result = load_dataset(DatasetConfig(path=str(path), prompt_field="question"))
    assert result.prompts[0].messages == [user("why?")]
    assert result.shape == "prompt"


def test_mapping_options_with_dotted_paths(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "nested.jsonl",
        [
            {
                "meta": {"uid": 11},
                "data": {
                    "q": "deep question",
                    "chat": [user("m")],
                    "sg": [{"from": "human", "value": "s"}, {"from": "gpt", "value": "t"}],
                },
                "prompt": "would be auto-detected but the mapping wins",
            },
            {"meta.uid": "dotted-key", "data": {"q": "top-level dotted key", "chat": [user("m2")], "sg": []}},
        ],
    )
    by_prompt = load_dataset(DatasetConfig(path=str(path), prompt_field="data.q", id_field="meta.uid"))
    assert [p.messages for p in by_prompt.prompts] == [
        [user("deep question")],
        [user("top-level dotted key")],
    ]
    assert [p.source_id for p in by_prompt.prompts] == ["11", "dotted-key"]

    by_messages = load_dataset(DatasetConfig(path=str(path), messages_field="data.chat"))
    assert [p.messages for p in by_messages.prompts] == [[user("m")], [user("m2")]]
    assert by_messages.shape == "messages"

    by_sg = load_dataset(DatasetConfig(path=str(path), conversations_field="data.sg", on_bad_line="skip"))
    assert [p.messages for p in by_sg.prompts] == [[user("s")]]
    assert [str(b) for b in by_sg.bad_lines] == [f"{path}:2: data.sg is empty"]

    list_index = write_jsonl(tmp_path / "idx.jsonl", [{"turns": [{"text": "first"}, {"text": "second"}]}])
    result = load_dataset(DatasetConfig(path=str(list_index), prompt_field="turns.1.text"))
    assert result.prompts[0].messages == [user("second")]


def test_missing_mapped_field_and_id_field(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [{"data": {"x": 1}, "id": 5}, {"data": {"q": "ok"}, "id": None}, {"data": {"q": "fine"}, "id": 3}],
    )
    result = load_dataset(DatasetConfig(path=str(path), prompt_field="data.q", id_field="id", on_bad_line="skip"))
    assert [str(b) for b in result.bad_lines] == [
        f"{path}:1: field 'data.q' not found (keys: data, id)",
        f"{path}:2: id field 'id' must be a string or an integer, got null",
    ]
    assert [(p.line, p.source_id) for p in result.prompts] == [(3, "3")]


def test_only_one_mapping_option(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "x"}])
    with pytest.raises(DatasetError, match="set only one of messages_field, prompt_field"):
        load_dataset(DatasetConfig(path=str(path), messages_field="a", prompt_field="b"))


# -------------------------------------------------------------------------------- system prompt


def test_system_prompt_prepended_unless_present(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {"prompt": "plain"},
            {"messages": [{"role": "system", "content": "dataset's own"}, user("q")]},
            {"conversations": [{"from": "system", "value": "sharegpt sys"}, {"from": "human", "value": "q"}]},
        ],
    )
    result = load_dataset(DatasetConfig(path=str(path), system_prompt="You are helpful."))
    assert [p.messages[0] for p in result.prompts] == [
        {"role": "system", "content": "You are helpful."},
        {"role": "system", "content": "dataset's own"},
        {"role": "system", "content": "sharegpt sys"},
    ]
    assert result.prompts[0].messages[1] == user("plain")
    assert all(sum(m["role"] == "system" for m in p.messages) == 1 for p in result.prompts)


# ------------------------------------------------------------------------------- shuffle / limit


def numbered(tmp_path: Path, n: int = 50) -> Path:
    return write_jsonl(tmp_path / "n.jsonl", [{"id": i, "prompt": f"p{i}"} for i in range(n)])


def ids(result: Any) -> list[str]:
    return [p.source_id for p in result.prompts]


def test_shuffle_is_deterministic(tmp_path: Path) -> None:
    path = str(numbered(tmp_path))
    in_order = ids(load_dataset(DatasetConfig(path=path)))
    a = ids(load_dataset(DatasetConfig(path=path, shuffle=True, seed=1)))
    b = ids(load_dataset(DatasetConfig(path=path, shuffle=True, seed=1)))
    c = ids(load_dataset(DatasetConfig(path=path, shuffle=True, seed=2)))
    assert a == b
    assert a != in_order and a != c
    assert sorted(a, key=int) == in_order
    # the original position travels with the prompt
    shuffled = load_dataset(DatasetConfig(path=path, shuffle=True, seed=1)).prompts
    assert all(p.source_id == str(p.index) and p.line == p.index + 1 for p in shuffled)


def test_limit_applies_after_shuffle(tmp_path: Path) -> None:
    path = str(numbered(tmp_path))
    assert ids(load_dataset(DatasetConfig(path=path, limit=3))) == ["0", "1", "2"]
    shuffled = ids(load_dataset(DatasetConfig(path=path, shuffle=True, seed=1)))
    limited = load_dataset(DatasetConfig(path=path, shuffle=True, seed=1, limit=5))
    assert ids(limited) == shuffled[:5]
    assert limited.total_rows == 50
    assert len(load_dataset(DatasetConfig(path=path, limit=500)).prompts) == 50
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        DatasetConfig(path=path, limit=0)


# ------------------------------------------------------------------------------------ bad lines

BAD_ROWS: list[Any] = [
    {"prompt": "good one"},  # 1
    '{"prompt": "missing comma" "x": 1}',  # 2 invalid JSON
    "",  # 3 blank: skipped, not an error
    {"prompt": 42},  # 4 wrong type
    {"question": "q", "answer": "a"},  # 5 missing fields
    "[1, 2]",  # 6 valid JSON, not an object
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "robot", "value": "beep"}]},  # 7 bad role
    {"messages": [{"role": "user", "content": "   "}]},  # 8 empty user content
    b'{"prompt": "caf\xe9"}',  # 9 invalid UTF-8 (latin-1 byte)
    "   ",  # 10 blank
    {"messages": [user("q"), {"role": "robot", "content": "x"}]},  # 11 bad role in messages
    {"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]},  # 12 no user
    {"conversations": [{"from": "gpt", "value": "only the model"}]},  # 13 nothing left
    {"messages": [user("look"), {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},  # 14
    {"messages": "not a list"},  # 15
    {"messages": [user("fine")], "id": 15},  # 16 good
    {"messages": [user("x"), {"role": "system", "content": "late system"}]},  # 17 last turn not user
    {"messages": [{"role": "user"}]},  # 18 content missing
]

EXPECTED_BAD = [
    (2, "invalid JSON: Expecting ',' delimiter at column 28"),
    (4, "prompt must be a string, got number"),
    (5, "no 'messages', 'conversations' or 'prompt' field (keys: question, answer)"),
    (6, "row is a JSON array, expected an object"),
    (7, "conversations[1].from is 'robot': expected human/gpt/system/user/assistant"),
    (8, "messages[0].content is empty (user turn)"),
    (9, "invalid UTF-8 at byte 16 of the line"),
    (11, "messages[1].role is 'robot': expected system/user/assistant/tool"),
    (12, "messages has no user turn"),
    (13, "conversations has no user turn"),
    (14, "messages[1].content[0] has type 'image_url': only text parts are supported"),
    (15, "messages must be an array, got string"),
    (17, "last turn is 'system', not 'user', after dropping trailing assistant turns"),
    (18, "messages[0].content is missing"),
]


def test_bad_lines_refused_by_default(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    with pytest.raises(DatasetError) as err:
        load_dataset(DatasetConfig(path=str(path)))
    message = str(err.value)
    assert message.splitlines()[0].startswith(f"{path}: 14 of 16 rows are bad; refusing to load")
    for line, reason in EXPECTED_BAD:
        assert f"  {path}:{line}: {reason}" in message.splitlines()
    assert [(b.line, b.reason) for b in err.value.bad_lines] == EXPECTED_BAD


def test_bad_lines_skipped_and_counted(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    result = load_dataset(DatasetConfig(path=str(path), on_bad_line="skip"))
    assert [(p.index, p.line, p.messages) for p in result.prompts] == [
        (0, 1, [user("good one")]),
        (13, 16, [user("fine")]),
    ]
    assert result.total_rows == 16  # non-blank lines
    assert len(result.bad_lines) == len(EXPECTED_BAD)
    assert all(b.file == str(path) for b in result.bad_lines)
    assert str(result.bad_lines[0]) == f"{path}:2: invalid JSON: Expecting ',' delimiter at column 28"


def test_error_message_lists_at_most_20(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "many.jsonl", [{"prompt": "ok"}] + ["not json"] * 25)
    with pytest.raises(DatasetError) as err:
        load_dataset(DatasetConfig(path=str(path)))
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"{path}: 25 of 26 rows are bad")
    assert len([x for x in lines if x.startswith(f"  {path}:")]) == 20
    assert lines[1] == f"  {path}:2: invalid JSON: Expecting value at column 1"
    assert lines[-1] == "  ... and 5 more (25 bad rows in total)"
    assert len(err.value.bad_lines) == 25


def test_all_bad_with_skip_is_an_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "allbad.jsonl", ["nope", "{}"])
    with pytest.raises(DatasetError, match="no usable prompts: all 2 rows are bad"):
        load_dataset(DatasetConfig(path=str(path), on_bad_line="skip"))


def test_lenient_json_that_orjson_refuses(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "lenient.jsonl",
        ['{"prompt": "nan elsewhere", "score": NaN}', '{"prompt": "lone \\ud800 surrogate"}'],
    )
    result = load_dataset(DatasetConfig(path=str(path), on_bad_line="skip"))
    assert [p.messages for p in result.prompts] == [[user("nan elsewhere")]]
    assert result.bad_lines[0].line == 2
    assert "surrogate" in result.bad_lines[0].reason


def test_bom_blank_lines_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\r\n\r\n\n{"prompt": "b"}\r\n')
    result = load_dataset(DatasetConfig(path=str(path)))
    assert [(p.index, p.line, p.messages) for p in result.prompts] == [
        (0, 1, [user("a")]),
        (1, 4, [user("b")]),
    ]
    assert result.total_rows == 2
    json_suffix = tmp_path / "lines.json"  # .json is read as JSON lines too
    json_suffix.write_bytes(path.read_bytes())
    assert len(load_dataset(DatasetConfig(path=str(json_suffix))).prompts) == 2


def test_gzip(tmp_path: Path) -> None:
    path = tmp_path / "pb.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row in PERFECTBLEND_ROWS:
            f.write(json.dumps(row) + "\n")
        f.write("{broken\n")
    result = load_dataset(DatasetConfig(path=str(path), on_bad_line="skip"))
    assert len(result.prompts) == 2
    assert [str(b) for b in result.bad_lines] == [
        f"{path}:3: invalid JSON: Expecting property name enclosed in double quotes at column 2"
    ]


def test_truncated_gzip_is_an_error(tmp_path: Path) -> None:
    data = gzip.compress(b'{"prompt": "a"}\n' * 1000)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=f"{path}: cannot read the file"):
        load_dataset(DatasetConfig(path=str(path)))


def test_iter_dataset_streams(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "a"}, "oops", {"prompt": "b"}])
    items = iter_dataset(DatasetConfig(path=str(path)))
    first = next(items)
    assert isinstance(first, Prompt) and items.total_rows == 1
    rest = list(items)
    assert [type(x) for x in rest] == [BadLine, Prompt]
    assert items.total_rows == 3 and items.shape == "prompt"

    with iter_dataset(DatasetConfig(path=str(path))) as early:  # stopping early closes the file
        assert isinstance(next(early), Prompt)
    with pytest.raises(StopIteration):
        next(early)


# ------------------------------------------------------------------------------ file-level errors


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match=f"{missing}: no such file or directory"):
        iter_dataset(DatasetConfig(path=str(missing)))  # raised before iterating


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("a,b\n")
    with pytest.raises(DatasetError, match="cannot tell the format from the file name"):
        load_dataset(DatasetConfig(path=str(path)))
    with pytest.raises(ValidationError, match="format"):
        DatasetConfig(path=str(path), format="csv")
    explicit = load_dataset(DatasetConfig(path=str(write_jsonl(tmp_path / "rows.txt", [{"prompt": "x"}])), format="jsonl"))
    assert len(explicit.prompts) == 1


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b"\xef\xbb\xbf\n"])
def test_empty_dataset(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=f"{path}: dataset is empty"):
        load_dataset(DatasetConfig(path=str(path)))


def test_json_array_file_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "array.json"
    path.write_text(json.dumps([{"prompt": "a"}, {"prompt": "b"}], indent=1))
    with pytest.raises(DatasetError, match="looks like one JSON array, not JSON lines"):
        load_dataset(DatasetConfig(path=str(path)))


# ---------------------------------------------------------------------------------------- parquet


def test_parquet(tmp_path: Path) -> None:
    table = pa.Table.from_pylist(
        [
            {"id": 10, "conversations": PERFECTBLEND_ROWS[0]["conversations"], "source": "x"},
            {"id": 11, "conversations": [{"from": "gpt", "value": "no human"}], "source": "y"},
            {"id": 12, "conversations": PERFECTBLEND_ROWS[1]["conversations"], "source": "z"},
        ]
    )
    path = tmp_path / "pb.parquet"
    pq.write_table(table, path, row_group_size=2)
    result = load_dataset(DatasetConfig(path=str(path), on_bad_line="skip"))
    assert result.shape == "conversations (ShareGPT)"
    assert [(p.index, p.line, p.source_id) for p in result.prompts] == [(0, 1, "10"), (2, 3, "12")]
    assert result.prompts[0].messages == [user("What is 2+2?")]
    assert [str(b) for b in result.bad_lines] == [f"{path}:2: conversations has no user turn"]


def test_parquet_nulls_and_missing_columns(tmp_path: Path) -> None:
    path = tmp_path / "mixed.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"prompt": "p", "messages": None},
                {"prompt": None, "messages": [user("m")]},
                {"prompt": None, "messages": None},
            ]
        ),
        path,
    )
    result = load_dataset(DatasetConfig(path=str(path), on_bad_line="skip"))
    assert [p.messages for p in result.prompts] == [[user("p")], [user("m")]]
    assert result.shape == "mixed: prompt 1, messages 1"
    assert result.bad_lines[0].line == 3
    assert "messages, prompt are null" in result.bad_lines[0].reason

    other = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q"}]), other)
    with pytest.raises(DatasetError, match=r"no 'messages', 'conversations' or 'prompt' column \(columns: question\)"):
        load_dataset(DatasetConfig(path=str(other)))
    assert load_dataset(DatasetConfig(path=str(other), prompt_field="question")).prompts[0].messages == [user("q")]


# ------------------------------------------------------------------------------- HF save_to_disk


def test_hf_save_to_disk_folder(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [{"idx": i, "messages": [user(f"q{i}"), {"role": "assistant", "content": "a"}]} for i in range(5)]
    folder = tmp_path / "hf"
    datasets.Dataset.from_list(rows).save_to_disk(str(folder), num_shards=2)
    result = load_dataset(DatasetConfig(path=str(folder)))
    assert result.shape == "messages"
    assert [(p.index, p.line, p.source_id) for p in result.prompts] == [(i, i + 1, str(i)) for i in range(5)]
    assert result.prompts[4].messages == [user("q4")]


def test_hf_dataset_dict_needs_split(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "hfdict"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"prompt": "t1"}, {"prompt": "t2"}]),
            "test": datasets.Dataset.from_list([{"prompt": ""}]),
        }
    ).save_to_disk(str(folder))
    with pytest.raises(DatasetError, match="is a DatasetDict with splits train, test; choose a split"):
        load_dataset(DatasetConfig(path=str(folder)))
    with pytest.raises(DatasetError, match="has no split 'validation'"):
        load_dataset(DatasetConfig(path=str(folder), split="validation"))
    train = load_dataset(DatasetConfig(path=str(folder), split="train"))
    assert [p.messages for p in train.prompts] == [[user("t1")], [user("t2")]]
    with pytest.raises(DatasetError) as err:
        load_dataset(DatasetConfig(path=str(folder), split="test"))
    assert f"{folder / 'test'}:1: prompt is empty" in str(err.value)


def test_folder_that_is_not_a_dataset(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not a folder written by datasets' save_to_disk"):
        load_dataset(DatasetConfig(path=str(tmp_path)))


def test_prepare_run_loads_once_and_refuses_a_bad_dataset(tmp_path: Path, engine: Any) -> None:
    """Loading a dataset into the queue is a domain step (sources/load.py), not a CLI one: the dashboard,
    tests and benchmarks call it directly, and its errors are not CLI exits."""
    import io

    from workerkit import make_config

    from synthwatch.sources.load import RunLoadError, prepare_run

    data = write_jsonl(tmp_path / "p.jsonl", [{"messages": [user(f"q{i}")]} for i in range(3)])
    config = make_config("http://127.0.0.1:9/v1", data, name="load-once")
    out = io.StringIO()
    run_id, resumed = prepare_run(engine, config, out=out)
    assert not resumed and "3 prompts" in out.getvalue()
    assert prepare_run(engine, config, out=out) == (run_id, True)
    bad = make_config("http://127.0.0.1:9/v1", tmp_path / "missing.jsonl", name="bad-one")
    with pytest.raises(RunLoadError, match="missing.jsonl"):
        prepare_run(engine, bad, out=out)
