"""What the simulated model says: an answer composed from the question (arithmetic it can really solve,
else an echo), padded to the configured lengths, split into token-sized pieces."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import orjson

from .config import SimConfig, parse_length
from .plan import Plan

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
class Gen:
    """What the model "said" to one prompt: independent of the reasoning_field mode."""

    reasoning: list[str]
    content: list[str]
    thinking: bool
    split_open: int  # 0, or where "<think>" is split across two chunks
    split_close: int
    rendered_prompt: str
    question: str = ""
    closed: bool = True  # False: the model stopped inside its reasoning (SimConfig.unclosed_reasoning)
    plans: dict[tuple[Any, ...], Plan] = field(default_factory=dict)
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


_ANSWER_RE = re.compile(r"\*\*(-?\d+)\*\*")


_JUDGED_Q_RE = re.compile(r"What is (\d+) \+ (\d+)\?")
_JUDGED_A_RE = re.compile(r"\*\*(-?\d+)\*\*|\\boxed\{(-?\d+)\}")  # bold, or boxed (SimConfig.boxed_answers)


def judge_reply(prompt: str) -> str:
    """The simulated judge's verdict on the answer quoted in ``prompt`` (SimConfig.judge), as JSON text."""
    q = _JUDGED_Q_RE.search(prompt)
    answers = [a or b for a, b in _JUDGED_A_RE.findall(prompt[q.end():] if q else prompt)]
    if q is None or not answers:
        verdict = {"score": 0.5, "label": "bad", "reason": "no question or no bold answer to judge"}
    else:
        want, got = int(q.group(1)) + int(q.group(2)), int(answers[-1])
        verdict = ({"score": 0.9, "label": "good", "reason": f"{got} is {q.group(1)} + {q.group(2)}"}
                   if got == want else
                   {"score": 0.1, "label": "bad", "reason": f"{got} is not {q.group(1)} + {q.group(2)} = {want}"})
    return orjson.dumps(verdict).decode()


def _wrong(digest: bytes, rate: float) -> bool:
    """Whether this request's answer is wrong: its own draw (the text's draws stay what they were)."""
    return random.Random(int.from_bytes(digest, "big") ^ 0x5EED).random() < rate


def _off_by_one(head: list[str]) -> list[str]:
    return [_ANSWER_RE.sub(lambda m: f"**{int(m.group(1)) + 1}**", h) for h in head]


def generate_answer(messages: list[Any], cfg: SimConfig, request_seed: Any, thinking: bool) -> Gen:
    question = ""
    for message in reversed(messages):
        if message.get("role") == "user":
            question = _message_text(message.get("content"))
            break
    if cfg.judge:
        return Gen([], pieces(judge_reply(question)), False, 0, 0, _render_prompt(messages), question)
    digest = hashlib.blake2b(orjson.dumps([cfg.seed, request_seed, messages]), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    if question.startswith("ECHO:"):
        echoed = question[5:]
        reasoning = _echo_pieces(echoed, rng) if thinking else []
        content = _echo_pieces(echoed, rng)
    else:
        r_sentences, head, body = _compose(question, rng)
        if cfg.rate_wrong_answer and _wrong(digest, cfg.rate_wrong_answer):
            head, body = _off_by_one(head), []
        if cfg.boxed_answers:
            head = [_ANSWER_RE.sub(lambda m: f"$\\boxed{{{m.group(1)}}}$", h) for h in head]
        r_target = min(parse_length(cfg.reasoning_tokens)(rng), cfg.max_model_len)
        c_target = min(parse_length(cfg.content_tokens)(rng), cfg.max_model_len)
        reasoning = _fill(r_sentences, _pad_reasoning, r_target, rng) if thinking else []
        content = pieces(" ".join(head))
        if c_target > len(content):
            content += _fill(body, _pad_content, c_target - len(content), rng, lead=" ")
    split_open = rng.randint(1, 6) if rng.random() < 0.5 else 0
    split_close = rng.randint(1, 7) if rng.random() < 0.5 else 0
    # drawn last, and only when asked for: every other reply stays what it was
    closed = not (thinking and reasoning and cfg.unclosed_reasoning and rng.random() < cfg.unclosed_reasoning)
    return Gen(reasoning, content if closed else [], thinking, split_open, split_close, _render_prompt(messages),
               question, closed)
