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
from .dataset_rows import AUTO_FIELDS, BadRow, RowConverter

__all__ = [
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


_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_BOM = b"\xef\xbb\xbf"
_BATCH_ROWS = 4096


@dataclass(slots=True)
class Prompt:
    index: int  # 0-based row index among non-blank lines / rows (bad rows count too)
    line: int | None  # 1-based line number (JSONL) or row number (Parquet / HF)
    source_id: str | None
    messages: list[dict[str, str]]
    row: dict[str, Any] | None = None  # the row's fields kept for the checks (a verifier's reference, #30)


def kept_fields(obj: Any, fields: tuple[str, ...]) -> dict[str, Any] | None:
    """The fields (dotted paths allowed) of a row that the extended checks read, those present only."""
    if not fields or not isinstance(obj, dict):
        return None
    out: dict[str, Any] = {}
    for f in fields:
        if f in obj:
            out[f] = obj[f]
            continue
        value: Any = obj
        for part in f.split("."):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[f] = value
    return out


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
            f"(add --skip-bad-lines, or on_bad_line = \"skip\" under [dataset] in the TOML, to skip bad rows and go on):"
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


def load_dataset(spec: DatasetConfig, keep: tuple[str, ...] = ()) -> LoadResult:
    """Load every row, apply the bad-line policy, then shuffle and limit.

    The whole source is always read (also with ``limit``), so bad rows anywhere are reported.
    The cyclic garbage collector is paused while rows are read: the rows make no cycles, and
    its repeated scans of a growing list of a million prompts would double the load time.
    """
    rows = iter_dataset(spec, keep)
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


def iter_dataset(spec: DatasetConfig, keep: tuple[str, ...] = ()) -> DatasetIterator:
    """Stream ``Prompt`` and ``BadLine`` items in source order (no shuffle, no limit, no policy).

    Spec and path problems raise :class:`DatasetError` here, before iteration; an empty source
    raises it when iteration ends. ``shape_counts`` and ``total_rows`` grow as rows are read. ``keep``: row
    fields each Prompt carries in ``row`` (the extended checks' reference fields).
    """
    return DatasetIterator(spec, keep)


class DatasetIterator(Iterator[Prompt | BadLine]):
    """The iterator returned by :func:`iter_dataset`."""

    def __init__(self, spec: DatasetConfig, keep: tuple[str, ...] = ()) -> None:
        _validate_spec(spec)
        self.spec = spec
        self.keep = keep
        self.source = str(spec.path)
        self.format = _resolve_format(spec)
        self.shape_counts: Counter[str] = Counter()
        self.total_rows = 0
        self._converter = RowConverter(spec)
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
            yield from self._rows(self.source, _parquet_batches(path, self.source, self._converter,
                                                                  self.keep))
        else:
            source, files = _hf_data_files(path, self.source, self.spec.split)
            self.source = source
            yield from self._rows(source, _arrow_batches(files, source, self._converter, self.keep))
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
                except BadRow as bad:
                    yield BadLine(source, index + 1, str(bad))
                else:
                    counts[shape] += 1
                    yield Prompt(index, index + 1, source_id, messages, kept_fields(row, self.keep))
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
                    except BadRow as bad:
                        yield BadLine(source, lineno, str(bad))
                    else:
                        counts[shape] += 1
                        yield Prompt(index, lineno, source_id, messages, kept_fields(obj, self.keep))
                    index += 1
            except (OSError, EOFError, zlib.error) as exc:
                where = f" (after line {lineno})" if lineno else ""
                raise DatasetError(f"{source}: cannot read the file{where}: {exc}") from exc


def field_names(spec: DatasetConfig, rows: int = 20) -> list[str]:
    """The top-level fields of a dataset, for a message naming those that exist: a JSONL file's first ``rows``
    objects' keys, a Parquet file's columns ([] when they cannot be read: only an error message is at stake)."""
    names: dict[str, None] = {}
    try:
        fmt = _resolve_format(spec)
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(spec.path).names)
        if fmt != "jsonl":
            return []
        with _open_jsonl(Path(spec.path), str(spec.path)) as f:
            for raw in f:
                if raw.strip():
                    obj = orjson.loads(raw.removeprefix(_BOM))
                    names.update(dict.fromkeys(str(k) for k in obj) if isinstance(obj, dict) else {})
                    rows -= 1
                    if rows <= 0:
                        break
    except Exception:  # noqa: BLE001 - the names only help a message; a file that cannot be read says so elsewhere
        pass
    return list(names)


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
        # json's own message for some errors already ends in "at" ("Invalid control character at")
        msg = exc.msg.removesuffix(" at")
        return None, f"invalid JSON: {msg} at column {exc.colno}"
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
        raise BadRow(f"invalid text: {exc.reason} (a lone \\u surrogate escape?)") from exc
    except orjson.JSONEncodeError as exc:
        raise BadRow(f"invalid text in tools or tool calls: {exc} (a lone \\u surrogate escape?)") from exc


# ----------------------------------------------------------------------------------------------
# Parquet and Arrow (HF save_to_disk)


def _table_columns(converter: RowConverter, names: list[str], source: str, keep: tuple[str, ...] = ()) -> list[str]:
    """Top-level columns to read from a Parquet / Arrow table (with those of the row fields kept, ``keep``, that
    exist); raises when nothing usable exists."""
    available = set(names)

    def column_of(path: str, what: str) -> str:
        column = path if path in available else path.split(".")[0]
        if column not in available:
            raise DatasetError(f"{source}: {what} {path!r}: no column {column!r} (columns: {', '.join(names)})")
        return column

    if converter.mapped is not None:
        wanted = [column_of(converter.mapped[1], "field")]
    else:
        wanted = [name for name, _ in AUTO_FIELDS if name in available]
        if not wanted:
            raise DatasetError(
                f"{source}: no 'messages', 'conversations' or 'prompt' column "
                f"(columns: {', '.join(names)}); map one with messages_field, conversations_field "
                f"or prompt_field"
            )
    if converter.id_field is not None:
        wanted.append(column_of(converter.id_field, "id_field"))
    else:
        wanted += [name for name in ("id", "idx") if name in available]
    wanted += [c for f in keep if (c := f if f in available else f.split(".")[0]) in available]
    return list(dict.fromkeys(wanted))


def _parquet_batches(path: Path, source: str, converter: RowConverter,
                     keep: tuple[str, ...] = ()) -> Iterator[list[dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        columns = _table_columns(converter, parquet.schema_arrow.names, source, keep)
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


def _arrow_batches(files: list[Path], source: str, converter: RowConverter,
                   keep: tuple[str, ...] = ()) -> Iterator[list[dict[str, Any]]]:
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
                    columns = _table_columns(converter, reader.schema.names, source, keep)
                for batch in batches:
                    yield batch.select(columns).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DatasetError(f"{source}: cannot read {file.name}: {exc}") from exc
