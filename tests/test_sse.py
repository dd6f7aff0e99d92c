"""SSEParser: spec behaviour, arbitrary feed boundaries, line endings, and the fast paths."""

from __future__ import annotations

import random

import pytest

from synthwatch.workers.sse import SSEParser


def reference_parse(stream: bytes) -> list[bytes]:
    """A slow, literal reading of the WHATWG event-stream rules (data payloads only)."""
    if stream.startswith(b"\xef\xbb\xbf"):
        stream = stream[3:]
    lines: list[bytes] = []
    i = 0
    start = 0
    n = len(stream)
    while i < n:
        ch = stream[i : i + 1]
        if ch == b"\n":
            lines.append(stream[start:i])
            i += 1
            start = i
        elif ch == b"\r":
            lines.append(stream[start:i])
            i += 2 if stream[i + 1 : i + 2] == b"\n" else 1
            start = i
        else:
            i += 1
    # bytes after the last line terminator are an unterminated line: never processed
    out: list[bytes] = []
    buf: bytes | None = None
    for line in lines:
        if line == b"":
            if buf is not None:
                out.append(buf[:-1] if buf.endswith(b"\n") else buf)
            buf = None
            continue
        if line.startswith(b":"):
            continue
        if b":" in line:
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
        else:
            name, value = line, b""
        if name == b"data":
            buf = (buf or b"") + value + b"\n"
    return out


def feed_all(pieces: list[bytes]) -> tuple[list[bytes], SSEParser]:
    p = SSEParser()
    out: list[bytes] = []
    for piece in pieces:
        out.extend(p.feed(piece))
    return out, p


def feed_split(stream: bytes, size: int) -> list[bytes]:
    return feed_all([stream[i : i + size] for i in range(0, len(stream), size)])[0]


VLLM_STREAM = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"reasoning":"skin"},"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":"\\u7d6e data: x"},"finish_reason":"length"}]}\n\n'
    b"data: [DONE]\n\n"
)


def test_single_event() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"a":1}\n\n') == [b'{"a":1}']
    assert p.pending() == b""


def test_several_events_in_one_piece_and_done() -> None:
    out, p = feed_all([VLLM_STREAM])
    assert len(out) == 4
    assert out[-1] == b"[DONE]"
    assert out[1].endswith(b'"finish_reason":null}]}')
    assert p.pending() == b""
    assert out == reference_parse(VLLM_STREAM)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64, 100, 4096])
def test_any_piece_size(size: int) -> None:
    assert feed_split(VLLM_STREAM, size) == reference_parse(VLLM_STREAM)


def test_every_two_way_split() -> None:
    expected = reference_parse(VLLM_STREAM)
    for i in range(len(VLLM_STREAM) + 1):
        out, p = feed_all([VLLM_STREAM[:i], VLLM_STREAM[i:]])
        assert out == expected, i
        assert p.pending() == b""


def test_incomplete_event_stays_pending() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"a":1}\n\ndata: {"b":') == [b'{"a":1}']
    assert p.pending() == b'data: {"b":'
    assert p.feed(b"2}\n") == []
    assert p.pending() == b'data: {"b":2}\n'
    assert p.feed(b"\n") == [b'{"b":2}']
    assert p.pending() == b""


def test_no_space_after_colon_and_only_one_space_removed() -> None:
    p = SSEParser()
    assert p.feed(b"data:x\n\ndata:  two\n\n") == [b"x", b" two"]


def test_multiline_data_joined_with_newline() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\ndata: b\ndata:c\n\n") == [b"a\nb\nc"]


def test_comments_and_other_fields_ignored() -> None:
    stream = (
        b": keep-alive\n\n"
        b"event: message\nid: 7\nretry: 1000\ndata: x\n\n"
        b"event: ping\n\n"
        b"datax: not data\ndata: y\n\n"
        b": another comment\n"
        b"data: z\n\n"
    )
    out, _ = feed_all([stream])
    assert out == [b"x", b"y", b"z"]
    assert out == reference_parse(stream)


def test_data_without_colon_and_empty_data() -> None:
    p = SSEParser()
    # "data" alone is a data line with an empty value; the spec dispatches an empty payload
    assert p.feed(b"data\n\ndata:\n\ndata: \n\n") == [b"", b"", b""]


def test_extra_blank_lines() -> None:
    stream = b"\n\n\ndata: a\n\n\n\n\ndata: b\n\n\n"
    out, _ = feed_all([stream])
    assert out == [b"a", b"b"] == reference_parse(stream)
    for i in range(len(stream) + 1):
        assert feed_all([stream[:i], stream[i:]])[0] == [b"a", b"b"], i


@pytest.mark.parametrize("eol", [b"\r\n", b"\r", b"\n"])
def test_line_endings(eol: bytes) -> None:
    stream = VLLM_STREAM.replace(b"\n", eol)
    expected = reference_parse(VLLM_STREAM)
    assert reference_parse(stream) == expected
    for size in (1, 2, 3, 11, 4096):
        out, p = feed_all([stream[i : i + size] for i in range(0, len(stream), size)])
        out.extend(p.flush())
        assert out == expected, size


def test_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"\n\r") == []
    assert p.feed(b"\n") == [b"a"]
    assert p.pending() == b""


def test_trailing_cr_needs_flush() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r\r") == []  # the last \r might be half of \r\n
    assert p.pending() == b"data: a\n\r"
    assert p.flush() == [b"a"]
    assert p.flush() == []


def test_bom_dropped() -> None:
    p = SSEParser()
    assert p.feed(b"\xef\xbb\xbfdata: a\n\n") == [b"a"]
    p = SSEParser()
    assert p.feed(b"\xef\xbb\xbf") == []
    assert p.feed(b"data: a\n\n") == [b"a"]
    # a BOM split over the first pieces
    assert feed_split(b"\xef\xbb\xbfdata: a\n\n", 1) == [b"a"]
    # only a leading BOM is dropped
    p = SSEParser()
    assert p.feed(b"data: a\n\n\xef\xbb\xbfdata: b\n\n") == [b"a"]


def test_empty_feed() -> None:
    p = SSEParser()
    assert p.feed(b"") == []
    assert p.pending() == b""


def test_unterminated_stream_end() -> None:
    out, p = feed_all([b"data: a\n\ndata: b\n"])
    assert out == [b"a"]
    assert p.pending() == b"data: b\n"
    assert p.flush() == []


def test_large_event_in_small_pieces() -> None:
    payload = b'{"content":"' + b"x" * 1_000_000 + b'"}'
    stream = b"data: " + payload + b"\n\ndata: [DONE]\n\n"
    assert feed_split(stream, 4096) == [payload, b"[DONE]"]


def test_payload_containing_data_prefix_text() -> None:
    # "data: " inside a JSON string (no raw newline there) must not confuse the fast path
    stream = b'data: {"c":"data: x"}\n\ndata: {"c":"\\n\\ndata: y"}\n\n'
    assert feed_split(stream, 4096) == [b'{"c":"data: x"}', b'{"c":"\\n\\ndata: y"}']


def test_randomized_against_reference() -> None:
    rng = random.Random(1234)
    atoms = [
        b"data: ",
        b"data:",
        b"data",
        b": c",
        b"event: e",
        b"id: 1",
        b"{}",
        b"x",
        b" ",
        b"\n",
        b"\n\n",
        b"\r\n",
        b"\r",
        b"datum",
        b"[DONE]",
        b"\xef\xbb\xbf",
        b"\xef",
    ]
    for _ in range(400):
        stream = b"".join(rng.choice(atoms) for _ in range(rng.randint(0, 40)))
        expected = reference_parse(stream)
        cuts = sorted(rng.randint(0, len(stream)) for _ in range(rng.randint(0, 6)))
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        out, p = feed_all(pieces)
        out.extend(p.flush())
        assert out == expected, (stream, cuts)


def test_one_event_per_read_fast_path_respects_state() -> None:
    p = SSEParser()
    events = [b"data: {%d}\n\n" % i for i in range(5)]
    assert [p.feed(e) for e in events] == [[b"{%d}" % i] for i in range(5)]
    # a pending partial event is completed by the next read, not skipped
    assert p.feed(b"data: par") == []
    assert p.feed(b"tial\n\n") == [b"partial"]
    assert p.feed(b"data: x\n") == []
    assert p.feed(b"data: y\n\n") == [b"x\ny"]
    # a held \r is a line end: "a" and "b" are two data lines of one event
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"data: b\n\n") == [b"a\nb"]
    # a \r inside the read means the line endings need normalizing
    assert p.feed(b"data: c\rdata: d\n\n") == [b"c\nd"]
