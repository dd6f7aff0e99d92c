"""Prompt loading: JSONL (messages / conversations / prompt), Parquet and HF ``save_to_disk`` folders.

Every row becomes either a :class:`Prompt` (OpenAI messages ending with a user turn) or a
:class:`BadLine` saying why not. Nothing is dropped silently.

Row shapes, detected per row in this order (the first key whose value is not null wins):

* ``messages``: OpenAI ``[{"role", "content"}]``; ``content`` may be a list of text parts.
* ``conversations``: ShareGPT ``[{"from": "human"|"gpt"|"system", "value"}]``; ``user``/``assistant``
  and ``role``/``content`` keys are accepted too (as SpecForge does).
* ``prompt``: a string (one user message), or a list of messages (TRL "conversational" prompts).

``messages_field`` / ``conversations_field`` / ``prompt_field`` (dotted paths, numeric parts index
lists) turn detection off and read that one field. Trailing assistant turns are dropped because the
target model writes the answer. Extra keys are ignored; the source id comes from ``id_field``, else
``id``, else ``idx``.

``system_prompt`` is prepended only when the prompt has no system message; a dataset's own system
message always wins and nothing is recorded about the override.

Tool use (``messages`` rows): assistant turns may carry ``tool_calls`` (OpenAI shape; their ``content``
may then be null), ``tool`` turns carry the result (``content``, ``tool_call_id``, ``name``), and the row's
``tools`` list (function definitions) is sent with the request. Such a prompt may end with a ``tool``
turn (the model answers the result); it is stored as ``{"messages": [...], "tools": [...]}``.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import random
import zlib
from collections import Counter
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from ..config import DatasetConfig

__all__ = [
    "SHAPE_CONVERSATIONS",
    "SHAPE_MESSAGES",
    "SHAPE_PROMPT",
    "BadLine",
    "DatasetError",
    "DatasetIterator",
    "LoadResult",
    "Prompt",
    "describe_shape",
    "iter_dataset",
    "load_dataset",
]

MAX_LISTED_BAD_LINES = 20

SHAPE_MESSAGES = "messages"
SHAPE_CONVERSATIONS = "conversations (ShareGPT)"
SHAPE_PROMPT = "prompt"

_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
}
_BOM = b"\xef\xbb\xbf"
_BATCH_ROWS = 4096
_MISSING: Any = object()


@dataclass(slots=True)
class Prompt:
    index: int  # 0-based row index among non-blank lines / rows (bad rows count too)
    line: int | None  # 1-based line number (JSONL) or row number (Parquet / HF)
    source_id: str | None
    messages: list[dict[str, str]]


@dataclass(slots=True)
class BadLine:
    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


class DatasetError(Exception):
    """A dataset that cannot be used; ``str()`` is meant for a terminal."""

    def __init__(self, message: str, bad_lines: list[BadLine] | None = None) -> None:
        super().__init__(message)
        self.bad_lines: list[BadLine] = bad_lines or []

    @classmethod
    def for_bad_lines(cls, source: str, bad_lines: list[BadLine], total_rows: int) -> DatasetError:
        n = len(bad_lines)
        head = (
            f"{source}: {n} of {total_rows} rows {'is' if n == 1 else 'are'} bad; refusing to load "
            f"(set on_bad_line to 'skip' to skip bad rows and go on):"
        )
        listed = [f"  {bad}" for bad in bad_lines[:MAX_LISTED_BAD_LINES]]
        if n > MAX_LISTED_BAD_LINES:
            listed.append(f"  ... and {n - MAX_LISTED_BAD_LINES} more ({n} bad rows in total)")
        return cls("\n".join([head, *listed]), bad_lines)


@dataclass
class LoadResult:
    prompts: list[Prompt]
    bad_lines: list[BadLine]
    shape: str
    total_rows: int


def describe_shape(counts: Counter[str]) -> str:
    """``"messages"``, ``"prompt"``... for one shape, ``"mixed: messages 3, prompt 2"`` for several."""
    if not counts:
        return "none"
    if len(counts) == 1:
        return next(iter(counts))
    return "mixed: " + ", ".join(f"{shape} {n}" for shape, n in counts.most_common())


def load_dataset(spec: DatasetConfig) -> LoadResult:
    """Load every row, apply the bad-line policy, then shuffle and limit.

    The whole source is always read (also with ``limit``), so bad rows anywhere are reported.
    The cyclic garbage collector is paused while rows are read: the rows make no cycles, and
    its repeated scans of a growing list of a million prompts would double the load time.
    """
    rows = iter_dataset(spec)
    prompts: list[Prompt] = []
    bad_lines: list[BadLine] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for item in rows:
            if isinstance(item, Prompt):
                prompts.append(item)
            else:
                bad_lines.append(item)
    finally:
        if gc_was_enabled:
            gc.enable()
    if bad_lines and spec.on_bad_line == "error":
        raise DatasetError.for_bad_lines(rows.source, bad_lines, rows.total_rows)
    if not prompts:
        raise DatasetError(f"{rows.source}: no usable prompts: all {rows.total_rows} rows are bad", bad_lines)
    if spec.shuffle:
        random.Random(spec.seed).shuffle(prompts)
    if spec.limit is not None:
        del prompts[spec.limit :]
    return LoadResult(prompts, bad_lines, describe_shape(rows.shape_counts), rows.total_rows)


def iter_dataset(spec: DatasetConfig) -> DatasetIterator:
    """Stream ``Prompt`` and ``BadLine`` items in source order (no shuffle, no limit, no policy).

    Spec and path problems raise :class:`DatasetError` here, before iteration; an empty source
    raises it when iteration ends. ``shape_counts`` and ``total_rows`` grow as rows are read.
    """
    return DatasetIterator(spec)


class DatasetIterator(Iterator[Prompt | BadLine]):
    """The iterator returned by :func:`iter_dataset`."""

    def __init__(self, spec: DatasetConfig) -> None:
        _validate_spec(spec)
        self.spec = spec
        self.source = str(spec.path)
        self.format = _resolve_format(spec)
        self.shape_counts: Counter[str] = Counter()
        self.total_rows = 0
        self._converter = _RowConverter(spec)
        self._gen = self._generate()

    def __iter__(self) -> Iterator[Prompt | BadLine]:
        return self._gen  # a for loop runs the generator directly, without __next__ per row

    def __next__(self) -> Prompt | BadLine:
        return next(self._gen)

    def close(self) -> None:
        """Stop early and close the open file."""
        self._gen.close()

    def __enter__(self) -> DatasetIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def shape(self) -> str:
        return describe_shape(self.shape_counts)

    def _generate(self) -> Generator[Prompt | BadLine, None, None]:
        path = Path(self.spec.path)
        if self.format == "jsonl":
            yield from self._jsonl(path)
        elif self.format == "parquet":
            yield from self._rows(self.source, _parquet_batches(path, self.source, self._converter))
        else:
            source, files = _hf_data_files(path, self.source, self.spec.split)
            self.source = source
            yield from self._rows(source, _arrow_batches(files, source, self._converter))
        if self.total_rows == 0:
            raise DatasetError(f"{self.source}: dataset is empty (no rows)")

    def _rows(self, source: str, batches: Iterable[list[dict[str, Any]]]) -> Iterator[Prompt | BadLine]:
        convert = self._converter.convert
        counts = self.shape_counts
        index = 0
        for batch in batches:
            for row in batch:
                self.total_rows = index + 1
                try:
                    shape, messages, source_id = convert(row)
                except _BadRow as bad:
                    yield BadLine(source, index + 1, str(bad))
                else:
                    counts[shape] += 1
                    yield Prompt(index, index + 1, source_id, messages)
                index += 1

    def _jsonl(self, path: Path) -> Iterator[Prompt | BadLine]:
        source = self.source
        convert = self._converter.convert
        counts = self.shape_counts
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError
        index = 0
        lineno = 0
        with _open_jsonl(path, source) as f:
            try:
                for lineno, raw in enumerate(f, 1):
                    if index == 0:  # first non-blank line: BOM, JSON array instead of JSON lines
                        if lineno == 1 and raw.startswith(_BOM):
                            raw = raw[len(_BOM) :]
                        if raw.isspace() or not raw:
                            continue
                        if raw.lstrip().startswith(b"["):
                            raise DatasetError(
                                f"{source}:{lineno}: this looks like one JSON array, not JSON lines "
                                f"(one object per line); convert it, e.g. jq -c '.[]' {source}"
                            )
                    slow_path = False
                    try:
                        obj = loads(raw)  # JSON allows the surrounding whitespace and newline
                    except decode_error:
                        if raw.isspace():  # blank line: skipped, not counted
                            continue
                        obj, reason = _parse_slowly(raw)
                        if reason is not None:
                            self.total_rows = index + 1
                            yield BadLine(source, lineno, reason)
                            index += 1
                            continue
                        slow_path = True
                    self.total_rows = index + 1
                    try:
                        shape, messages, source_id = convert(obj)
                        if slow_path:
                            _check_encodable(messages, source_id)
                    except _BadRow as bad:
                        yield BadLine(source, lineno, str(bad))
                    else:
                        counts[shape] += 1
                        yield Prompt(index, lineno, source_id, messages)
                    index += 1
            except (OSError, EOFError, zlib.error) as exc:
                where = f" (after line {lineno})" if lineno else ""
                raise DatasetError(f"{source}: cannot read the file{where}: {exc}") from exc


# ----------------------------------------------------------------------------------------------
# spec and path checks


def _validate_spec(spec: DatasetConfig) -> None:
    source = str(spec.path)
    if not source:
        raise DatasetError("dataset path is empty")
    mapped = [
        name for name in ("messages_field", "conversations_field", "prompt_field") if getattr(spec, name) is not None
    ]
    if len(mapped) > 1:
        raise DatasetError(f"{source}: set only one of {', '.join(mapped)}")
    for name in ("messages_field", "conversations_field", "prompt_field", "id_field"):
        value = getattr(spec, name)
        if value is not None and (not value or "" in value.split(".")):
            raise DatasetError(f"{source}: {name} {value!r} is not a valid dotted path")


def _resolve_format(spec: DatasetConfig) -> str:
    source = str(spec.path)
    path = Path(spec.path)
    if not path.exists():
        raise DatasetError(f"{source}: no such file or directory")
    if spec.format == "hf" or (spec.format == "auto" and path.is_dir()):
        if not path.is_dir():
            raise DatasetError(f"{source}: format 'hf' needs a folder written by datasets' save_to_disk")
        return "hf"
    if path.is_dir():
        raise DatasetError(f"{source}: is a folder; format {spec.format!r} needs a file")
    if spec.format != "auto":
        return spec.format
    name = path.name.lower()
    if name.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    raise DatasetError(
        f"{source}: cannot tell the format from the file name (expected .jsonl, .jsonl.gz, .json, "
        f".parquet or a datasets save_to_disk folder); set the format explicitly"
    )


# ----------------------------------------------------------------------------------------------
# JSON lines


def _open_jsonl(path: Path, source: str) -> IO[bytes]:
    try:
        with open(path, "rb") as probe:
            magic = probe.read(2)
        if magic == b"\x1f\x8b":
            # GzipFile's own readline is slow; a 1 MiB buffer in front of it halves the cost per line
            return io.BufferedReader(gzip.GzipFile(path, "rb"), buffer_size=1 << 20)
        if magic in (b"\xff\xfe", b"\xfe\xff"):
            raise DatasetError(f"{source}: file is UTF-16 encoded; convert it to UTF-8")
        return open(path, "rb")
    except OSError as exc:
        raise DatasetError(f"{source}: cannot open: {exc.strerror or exc}") from exc


def _parse_slowly(raw: bytes) -> tuple[Any, str | None]:
    """Explain a line orjson refused, or parse it when only orjson is strict (NaN, lone surrogates)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"invalid UTF-8 at byte {exc.start + 1} of the line"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc.msg} at column {exc.colno}"
    except RecursionError:
        return None, "invalid JSON: nested too deeply"


def _check_encodable(messages: list[dict[str, str]], source_id: str | None) -> None:
    try:
        if isinstance(messages, dict):  # a prompt with tools
            orjson.dumps(messages["tools"])
            messages = messages["messages"]
        for message in messages:
            message["content"].encode("utf-8")
            if "tool_calls" in message:
                orjson.dumps(message["tool_calls"])
        if source_id is not None:
            source_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _BadRow(f"invalid text: {exc.reason} (a lone \\u surrogate escape?)") from exc
    except orjson.JSONEncodeError as exc:
        raise _BadRow(f"invalid text in tools or tool calls: {exc} (a lone \\u surrogate escape?)") from exc


# ----------------------------------------------------------------------------------------------
# Parquet and Arrow (HF save_to_disk)


def _parquet_batches(path: Path, source: str, converter: _RowConverter) -> Iterator[list[dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        columns = converter.columns(parquet.schema_arrow.names, source)
        for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=columns):
            yield batch.to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{source}: cannot read Parquet: {exc}") from exc


def _hf_data_files(path: Path, source: str, split: str | None) -> tuple[str, list[Path]]:
    """The Arrow files of a ``save_to_disk`` folder (choosing ``split`` in a DatasetDict)."""
    dict_file = path / "dataset_dict.json"
    if dict_file.is_file():
        splits = [str(s) for s in _read_json(dict_file, source).get("splits", [])]
        if split is None:
            raise DatasetError(f"{source}: is a DatasetDict with splits {', '.join(splits)}; choose a split")
        if split not in splits:
            raise DatasetError(f"{source}: has no split {split!r} (splits: {', '.join(splits)})")
        path = path / split
        source = os.path.join(source, split)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise DatasetError(
            f"{source}: not a folder written by datasets' save_to_disk (no state.json or dataset_dict.json)"
        )
    state = _read_json(state_file, source)
    saved_split = state.get("_split")
    if split is not None and not dict_file.is_file() and saved_split not in (None, split):
        raise DatasetError(f"{source}: holds split {saved_split!r}, not {split!r}")
    try:
        files = [path / str(entry["filename"]) for entry in state["_data_files"]]
    except (KeyError, TypeError) as exc:
        raise DatasetError(f"{source}/state.json: no usable _data_files list") from exc
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise DatasetError(f"{source}: data files listed in state.json are missing: {', '.join(missing)}")
    return source, files


def _read_json(path: Path, source: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{source}: cannot read {path.name}: {exc}") from exc
    if not isinstance(value, dict):
        raise DatasetError(f"{source}: {path.name} is not a JSON object")
    return value


def _arrow_batches(files: list[Path], source: str, converter: _RowConverter) -> Iterator[list[dict[str, Any]]]:
    import pyarrow as pa

    columns: list[str] | None = None
    for file in files:
        try:
            with pa.memory_map(str(file), "r") as mapped:
                try:
                    reader: Any = pa.ipc.open_stream(mapped)
                except pa.ArrowInvalid:  # not a stream: try the Arrow file format
                    mapped.seek(0)
                    reader = pa.ipc.open_file(mapped)
                    batches: Iterable[Any] = (reader.get_batch(i) for i in range(reader.num_record_batches))
                else:
                    batches = reader
                if columns is None:
                    columns = converter.columns(reader.schema.names, source)
                for batch in batches:
                    yield batch.select(columns).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DatasetError(f"{source}: cannot read {file.name}: {exc}") from exc


# ----------------------------------------------------------------------------------------------
# rows -> messages


class _BadRow(Exception):
    pass


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _keys(row: dict[str, Any]) -> str:
    keys = [str(k) for k in row]
    shown = ", ".join(keys[:12])
    return f"{shown}, ... ({len(keys)} keys)" if len(keys) > 12 else shown or "none"


def _lookup(row: dict[str, Any], path: str, parts: list[str]) -> Any:
    if path in row:
        return row[path]
    value: Any = row
    for part in parts:
        if isinstance(value, dict):
            if part not in value:
                return _MISSING
            value = value[part]
        elif isinstance(value, list) and part.isdigit():
            if int(part) >= len(value):
                return _MISSING
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _text(content: Any, where: str, turn: dict[str, Any], key: str) -> str:
    if content.__class__ is str:
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise _BadRow(f"{where}[{j}] must be an object, got {_type_name(part)}")
            kind = part.get("type")
            if kind != "text":
                raise _BadRow(f"{where}[{j}] has type {kind!r}: only text parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise _BadRow(f"{where}[{j}].text must be a string, got {_type_name(text)}")
            texts.append(text)
        return "\n".join(texts)
    if content is None:
        raise _BadRow(f"{where} is {'null' if key in turn else 'missing'}")
    raise _BadRow(f"{where} must be a string or a list of text parts, got {_type_name(content)}")


def _messages(value: Any, label: str) -> list[dict[str, str]]:
    if value.__class__ is not list:
        raise _BadRow(f"{label} must be an array, got {_type_name(value)}")
    for turn in value:
        if not (
            turn.__class__ is dict
            and len(turn) == 2
            and (content := turn.get("content")).__class__ is str
            and ((role := turn.get("role")) == "assistant" or role == "system" or role == "user")
            and (role != "user" or (content and not content.isspace()))
        ):
            break
    else:
        return value  # every turn is exactly a valid {"role", "content"}: reuse the parsed list
    out = []
    for i, turn in enumerate(value):
        # fast path for well-formed turns; _message_turn explains everything else
        if turn.__class__ is dict and len(turn) == 2:
            role = turn.get("role")
            content = turn.get("content")
            if content.__class__ is str and (
                role == "assistant" or role == "system" or (role == "user" and content and not content.isspace())
            ):
                out.append({"role": role, "content": content})
                continue
        out.append(_message_turn(turn, label, i))
    return out


def _message_turn(turn: Any, label: str, i: int) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise _BadRow(f"{label}[{i}] must be an object, got {_type_name(turn)}")
    role = turn.get("role")
    if role is None:
        raise _BadRow(f"{label}[{i}] has no role")
    if not isinstance(role, str):
        raise _BadRow(f"{label}[{i}].role must be a string, got {_type_name(role)}")
    if role not in _ROLES:
        raise _BadRow(f"{label}[{i}].role is {role!r}: expected system/user/assistant/tool")
    where = f"{label}[{i}]"
    calls = turn.get("tool_calls")
    if role == "assistant" and calls is not None:
        out: dict[str, Any] = {"role": role, "content": "" if turn.get("content") is None else
                               _text(turn.get("content"), f"{where}.content", turn, "content"),
                               "tool_calls": _tool_calls(calls, f"{where}.tool_calls")}
        return out
    out = _turn(role, turn, "content", f"{where}.content")
    if role == "tool":
        for key in ("tool_call_id", "name"):
            value = turn.get(key)
            if value is not None and not isinstance(value, str):
                raise _BadRow(f"{where}.{key} must be a string, got {_type_name(value)}")
            if value is not None:
                out[key] = value
    return out


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI tool calls [{"id", "type": "function", "function": {"name", "arguments": JSON text}}]."""
    if not isinstance(calls, list) or not calls:
        raise _BadRow(f"{where} must be a non-empty array")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _BadRow(f"{where}[{j}].function.name must be a non-empty string")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):  # some datasets store the arguments as an object: send JSON text
            args = json.dumps(args, ensure_ascii=False)
        item: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if isinstance(call.get("id"), str):
            item = {"id": call["id"], **item}
        out.append(item)
    return out


def _tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
        for t in value
    ):
        raise _BadRow("tools must be an array of {\"type\": \"function\", \"function\": {\"name\", ...}} objects")
    return value


def _conversations(value: Any, label: str) -> list[dict[str, str]]:
    if value.__class__ is not list:
        raise _BadRow(f"{label} must be an array, got {_type_name(value)}")
    out = []
    for i, turn in enumerate(value):
        # fast path for well-formed from/value turns; _conversation_turn explains everything else
        if turn.__class__ is dict:
            speaker = turn.get("from")
            content = turn.get("value")
            if speaker.__class__ is str and content.__class__ is str:
                role = _SHAREGPT_ROLES.get(speaker)
                if role is not None and (role != "user" or (content and not content.isspace())):
                    out.append({"role": role, "content": content})
                    continue
        out.append(_conversation_turn(turn, label, i))
    return out


def _conversation_turn(turn: Any, label: str, i: int) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise _BadRow(f"{label}[{i}] must be an object, got {_type_name(turn)}")
    role_key, content_key = "from", "value"
    speaker = turn.get("from")
    if speaker is None and turn.get("role") is not None:  # SpecForge-style role/content keys
        role_key, content_key = "role", "content"
        speaker = turn["role"]
    if speaker is None:
        raise _BadRow(f"{label}[{i}] has no 'from' (or 'role')")
    if not isinstance(speaker, str):
        raise _BadRow(f"{label}[{i}].{role_key} must be a string, got {_type_name(speaker)}")
    role = _SHAREGPT_ROLES.get(speaker)
    if role is None:
        raise _BadRow(f"{label}[{i}].{role_key} is {speaker!r}: expected human/gpt/system/user/assistant")
    return _turn(role, turn, content_key, f"{label}[{i}].{content_key}")


def _turn(role: str, turn: dict[str, Any], key: str, where: str) -> dict[str, str]:
    content = _text(turn.get(key), where, turn, key)
    if role == "user" and (not content or content.isspace()):
        raise _BadRow(f"{where} is empty (user turn)")
    return {"role": role, "content": content}


def _prompt(value: Any, label: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        if not value or value.isspace():
            raise _BadRow(f"{label} is empty")
        return [{"role": "user", "content": value}]
    if isinstance(value, list):  # TRL conversational prompt: a list of messages
        return _messages(value, label)
    raise _BadRow(f"{label} must be a string, got {_type_name(value)}")


_PARSERS = {
    SHAPE_MESSAGES: _messages,
    SHAPE_CONVERSATIONS: _conversations,
    SHAPE_PROMPT: _prompt,
}
_AUTO_FIELDS = (
    ("messages", SHAPE_MESSAGES),
    ("conversations", SHAPE_CONVERSATIONS),
    ("prompt", SHAPE_PROMPT),
)


class _RowConverter:
    """Turns one row (a dict) into (shape, messages, source_id) or raises ``_BadRow``."""

    def __init__(self, spec: DatasetConfig) -> None:
        self.system_prompt = spec.system_prompt or None
        self.mapped: tuple[str, str, list[str]] | None = None  # (shape, path, parts)
        for field, shape in (
            (spec.messages_field, SHAPE_MESSAGES),
            (spec.conversations_field, SHAPE_CONVERSATIONS),
            (spec.prompt_field, SHAPE_PROMPT),
        ):
            if field is not None:
                self.mapped = (shape, field, field.split("."))
        self.id_field = spec.id_field
        self.id_parts = spec.id_field.split(".") if spec.id_field else []

    def columns(self, names: list[str], source: str) -> list[str]:
        """Top-level columns to read from a Parquet / Arrow table; raises when nothing usable exists."""
        available = set(names)

        def column_of(path: str, what: str) -> str:
            column = path if path in available else path.split(".")[0]
            if column not in available:
                raise DatasetError(f"{source}: {what} {path!r}: no column {column!r} (columns: {', '.join(names)})")
            return column

        if self.mapped is not None:
            wanted = [column_of(self.mapped[1], "field")]
        else:
            wanted = [name for name, _ in _AUTO_FIELDS if name in available]
            if not wanted:
                raise DatasetError(
                    f"{source}: no 'messages', 'conversations' or 'prompt' column "
                    f"(columns: {', '.join(names)}); map one with messages_field, conversations_field "
                    f"or prompt_field"
                )
        if self.id_field is not None:
            wanted.append(column_of(self.id_field, "id_field"))
        else:
            wanted += [name for name in ("id", "idx") if name in available]
        return list(dict.fromkeys(wanted))

    def convert(self, row: Any) -> tuple[str, list[dict[str, str]], str | None]:
        if row.__class__ is not dict:
            raise _BadRow(f"row is a JSON {_type_name(row)}, expected an object")
        if self.mapped is None:
            if (value := row.get("messages")) is not None:
                shape, label = SHAPE_MESSAGES, "messages"
                messages = _messages(value, label)
            elif (value := row.get("conversations")) is not None:
                shape, label = SHAPE_CONVERSATIONS, "conversations"
                messages = _conversations(value, label)
            elif (value := row.get("prompt")) is not None:
                shape, label = SHAPE_PROMPT, "prompt"
                if value.__class__ is str and value and not value.isspace() and self.system_prompt is None:
                    return shape, [{"role": "user", "content": value}], self._source_id(row)
                messages = _prompt(value, label)
            else:
                nulls = [k for k, _ in _AUTO_FIELDS if k in row]
                note = f"; {', '.join(nulls)} {'is' if len(nulls) == 1 else 'are'} null" if nulls else ""
                raise _BadRow(f"no 'messages', 'conversations' or 'prompt' field (keys: {_keys(row)}){note}")
        else:
            shape, label, parts = self.mapped
            value = _lookup(row, label, parts)
            if value is _MISSING:
                raise _BadRow(f"field {label!r} not found (keys: {_keys(row)})")
            if value is None:
                raise _BadRow(f"field {label!r} is null")
            messages = _PARSERS[shape](value, label)

        tools = row.get("tools") if shape == SHAPE_MESSAGES else None
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages:
            raise _BadRow(f"{label} has no user turn" if value else f"{label} is empty")
        last = messages[-1]["role"]
        if last != "user" and not (last == "tool" and tools):
            if not any(m["role"] == "user" for m in messages):
                raise _BadRow(f"{label} has no user turn")
            raise _BadRow(f"last turn is {last!r}, not 'user', after dropping trailing assistant turns")
        if self.system_prompt is not None and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        if tools:
            return shape, {"messages": messages, "tools": _tools(tools)}, self._source_id(row)  # type: ignore[return-value]
        return shape, messages, self._source_id(row)

    def _source_id(self, row: dict[str, Any]) -> str | None:
        if self.id_field is None:
            source_id = row.get("id")
            if source_id is None:
                source_id = row.get("idx")
            if source_id is None or source_id.__class__ is str:
                return source_id
            return _id_text(source_id)
        value = _lookup(row, self.id_field, self.id_parts)
        if value is _MISSING:
            raise _BadRow(f"id field {self.id_field!r} not found (keys: {_keys(row)})")
        text = _id_text(value)
        if text is None:
            raise _BadRow(f"id field {self.id_field!r} must be a string or an integer, got {_type_name(value)}")
        return text


def _id_text(value: Any) -> str | None:
    if value.__class__ is str:
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return None
