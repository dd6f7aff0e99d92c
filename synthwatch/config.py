"""RunConfig: everything one generation run needs, from a TOML file and/or CLI flags.

Unknown keys are errors (a typo must not silently fall back to a default), and the snapshot
stored with the run never contains secrets: API keys are named by environment variable only.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from .capture.reasoning import ReasoningMode
from .check_catalog import CheckSettings

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NESTED_PROBLEM = re.compile(r"^[A-Za-z0-9_.\[\]]+: ")


class ConfigError(Exception):
    """Bad run configuration; the message names the key and the source. ``problems`` holds each problem as
    (location, message) when the configuration failed validation (a form shows each beside its field)."""

    def __init__(self, message: str, problems: list[tuple[tuple[str | int, ...], str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


@dataclass(frozen=True)
class Option:
    """How a run setting is offered besides the config file: its command-line flag and its field on the
    dashboard's start-a-run form. The setting's type, default, limits and description stay the Field's."""

    flag: str
    label: str
    form: str
    flag_value: Any = None  # a flag that takes no argument and sets this value (--skip-bad-lines: "skip")
    flag_help: str | None = None  # when the flag needs other words than the field's description


def options(model: type[BaseModel]) -> list[tuple[str, FieldInfo, Option]]:
    """(field name, field, Option) of every field of the model declared with an Option, in order."""
    out = []
    for name, info in model.model_fields.items():
        opt = next((m for m in info.metadata if isinstance(m, Option)), None)
        if opt is not None:
            out.append((name, info, opt))
    return out


def option_kind(info: FieldInfo) -> tuple[str, tuple[Any, ...] | None, bool]:
    """(kind, choices, at least 1) of an option's field: kind is "bool", "choice" (a Literal), "int" or "text"."""
    args = [a for a in get_args(info.annotation) if a is not type(None)]
    scalar = args[0] if get_origin(info.annotation) in (Union, UnionType) and len(args) == 1 else info.annotation
    at_least_1 = any(getattr(m, "ge", None) == 1 for m in info.metadata)
    if scalar is bool:
        return "bool", None, False
    if get_origin(scalar) is Literal:
        return "choice", get_args(scalar), False
    return ("int" if scalar is int else "text"), None, at_least_1


class DatasetConfig(_Strict):
    """The `[dataset]` table. A field declared here with an Option is also a flag of `synthwatch run`
    (commands/run.py), a field of the start-a-run form (app/launch.py), and what the loader reads
    (sources/datasets.py): adding an option is adding a field."""

    path: Annotated[str, Option("--dataset", "Dataset path", "dataset"),
                    Field(description="JSONL (.jsonl/.jsonl.gz), Parquet, or an HF save_to_disk folder.")]
    format: Annotated[Literal["auto", "jsonl", "parquet", "hf"],
                      Option("--dataset-format", "Dataset format", "dataset_format"),
                      Field(description="How to read it (auto: from the file name).")] = "auto"
    split: Annotated[str | None, Option("--split", "Split (HF folders)", "dataset_split"),
                     Field(description="Split of an HF save_to_disk folder.")] = None
    messages_field: Annotated[str | None, Option("--messages-field", "Messages field", "dataset_messages_field"),
                              Field(description="Dotted path to an OpenAI messages list.")] = None
    conversations_field: Annotated[str | None, Option("--conversations-field", "Conversations field",
                                                      "dataset_conversations_field"),
                                   Field(description="Dotted path to a ShareGPT conversations list.")] = None
    prompt_field: Annotated[str | None, Option("--prompt-field", "Prompt field", "dataset_prompt_field"),
                            Field(description="Dotted path to a plain prompt string.")] = None
    id_field: Annotated[str | None, Option("--id-field", "Id field", "dataset_id_field"),
                        Field(description="Dotted path to a stable source id.")] = None
    system_prompt: Annotated[str | None, Option("--system-prompt", "System prompt", "dataset_system_prompt"),
                             Field(description="Prepended to prompts that have no system message.")] = None
    shuffle: Annotated[bool, Option("--shuffle", "Shuffle the prompts", "dataset_shuffle"),
                       Field(description="Shuffle the prompts (with seed) before limit.")] = False
    seed: Annotated[int, Option("--shuffle-seed", "Shuffle seed", "dataset_seed"),
                    Field(description="Seed of the shuffle.")] = 0
    limit: Annotated[int | None, Option("--limit", "Limit (first N prompts)", "limit"),
                     Field(ge=1, description="Only the first N prompts (after the shuffle).")] = None
    on_bad_line: Annotated[Literal["error", "skip"],
                           Option("--skip-bad-lines", "Malformed rows", "dataset_on_bad_line", flag_value="skip",
                                  flag_help="skip and count malformed rows instead of refusing to start"),
                           Field(description="error: refuse to start; skip: skip and count malformed rows.")] = "error"


# names HTTP requires for a header field (RFC 9110 token characters)
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# set by the HTTP client from the request itself: an endpoint may not override them
_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "content-type",
                               "upgrade", "te", "trailer", "keep-alive", "proxy-authorization", "expect"})


class TLSConfig(_Strict):
    ca_bundle: str | None = Field(None, description="PEM file of the CAs to trust (instead of the system's).")
    client_cert: str | None = Field(None, description="PEM client certificate (may hold the key too).")
    client_key: str | None = Field(None, description="PEM private key of client_cert, if not in that file.")
    verify: bool = Field(True, description="Verify the server's certificate and host name (off: testing only).")

    @model_validator(mode="after")
    def _key_needs_cert(self) -> TLSConfig:
        if self.client_key and not self.client_cert:
            raise ValueError("client_key needs client_cert")
        return self


class EndpointConfig(_Strict):
    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str | None = Field(None, description="Name of the environment variable holding the key.")
    name: str | None = None
    headers_env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra request headers: header name -> NAME of the environment variable holding its value.",
    )
    tls: TLSConfig = Field(default_factory=TLSConfig)
    price_in_per_mtok: float | None = Field(None, ge=0, description="Price per million prompt tokens (cost view).")
    price_out_per_mtok: float | None = Field(None, ge=0, description="Price per million completion tokens.")

    @field_validator("headers_env")
    @classmethod
    def _check_headers(cls, v: dict[str, str]) -> dict[str, str]:
        seen: set[str] = set()
        for name, env in v.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name[:60]!r} is not a valid HTTP header name")
            if name.lower() in _RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by the HTTP client and cannot be configured")
            if name.lower() in seen:
                raise ValueError(f"header {name!r} is given twice")
            seen.add(name.lower())
            if not _ENV_NAME.match(env):
                raise ValueError(f"headers_env.{name} must be the NAME of an environment variable (got something "
                                 f"else: {len(env)} characters); header values are never written to config files")
        return v

    @field_validator("base_url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        parsed = urlparse(v)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"not an http(s) URL: {v!r} (expected e.g. http://127.0.0.1:8000/v1)")
        if parsed.username or parsed.password:
            raise ValueError("put credentials in an environment variable named by api_key_env, not in the URL")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _check_env(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError(
                f"api_key_env must be the NAME of an environment variable (got something else: "
                f"{len(v)} characters); the key itself is never written to config files"
            )
        return v

    @property
    def label(self) -> str:
        return self.name or urlparse(self.base_url).netloc


class SamplingConfig(_Strict):
    temperature: float | None = Field(None, ge=0, le=5)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=10_000_000)
    seed: int | None = None
    stop: list[str] | None = None
    logprobs: bool = Field(False, description="Ask for each completion token's logprob (OpenAI chat API, vLLM); "
                           "stored packed per record (logprobs_json) and exported with the tokens formats.")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="With logprobs: the most likely alternatives "
                                     "per token the server also returns (0-20; vLLM's --max-logprobs bounds it).")
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Merged into every request body, e.g. chat_template_kwargs."
    )

    @model_validator(mode="after")
    def _check_logprobs(self) -> SamplingConfig:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs = true (the OpenAI API and vLLM refuse it alone)")
        return self


class TimeoutConfig(_Strict):
    connect_s: float = Field(10.0, gt=0, description="TCP connect timeout.")
    total_s: float = Field(1800.0, gt=0, description="Whole request, first byte to last.")
    idle_s: float = Field(60.0, gt=0, description="Longest silence between stream chunks.")


class LimitsConfig(_Strict):
    max_body_bytes: int = Field(64 * 2**20, ge=1024, description="Largest reply body that is not streamed (decoded).")
    max_event_bytes: int = Field(16 * 2**20, ge=1024, description="Largest single event of a streamed reply.")
    max_reply_bytes: int = Field(
        64 * 2**20, ge=1024, description="Largest reply in total, streamed or not, counted after decompression.")
    max_partial_chars: int = Field(
        2**20, ge=0, description="Longest reasoning or content kept from a failed attempt's partial reply.")
    max_header_bytes: int = Field(
        8190, ge=256, le=2**20, description="Longest status line or header field of a reply, in bytes.")
    max_headers: int = Field(128, ge=8, le=10_000, description="Most header fields a reply may have.")
    max_logprobs_bytes: int = Field(
        4 * 2**20, ge=0, le=2**30, description="Largest packed logprobs column of one record (sampling.logprobs); "
        "the tokens past it are left out and the record says so.")


class RetryConfig(_Strict):
    max_attempts: int = Field(4, ge=1, le=100)
    backoff_base_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)


class ReasoningConfig(_Strict):
    mode: ReasoningMode = "auto"
    expect: bool = Field(True, description="The model is expected to produce reasoning (checks use this).")
    think_open: str = "<think>"
    think_close: str = "</think>"
    prefilled_open: bool = Field(False, description="The chat template ends the prompt with the open tag.")


class TokenizerConfig(_Strict):
    name_or_path: str = Field(description="Local folder, cached hub name, or 'deepseek-v4' (shipped).")
    chat_template: str | None = Field(None, description="Path to a .jinja file, or 'deepseek-v4'.")
    trust_remote_code: bool = False


class EndpointPoolConfig(_Strict):
    eject_after_failures: int = Field(5, ge=1)
    eject_s: float = Field(10.0, gt=0)
    eject_max_s: float = Field(120.0, gt=0)


class ServerMetricsConfig(_Strict):
    enabled: bool = Field(True, description="Scrape each endpoint's /metrics (vLLM, SGLang) while the run goes.")
    interval_s: float = Field(2.0, ge=0.2, le=3600, description="Seconds between two scrapes of one endpoint.")
    timeout_s: float = Field(2.0, gt=0, le=60, description="Longest wait for one scrape.")


class AutotuneConfig(_Strict):
    enabled: bool = Field(False, description="Tune the concurrency to the servers (`--concurrency auto`).")
    min: int = Field(1, ge=1, le=100_000, description="Fewest requests in flight the tuner sets, per endpoint.")
    max: int = Field(1024, ge=1, le=100_000, description="Most requests in flight the tuner sets, per endpoint.")
    start: int = Field(8, ge=1, le=100_000, description="Concurrency the tuner starts from (within min..max).")
    interval_s: float = Field(5.0, ge=0.5, le=600, description="Seconds between two tuning steps.")
    gain: float = Field(0.05, ge=0, le=1, description="Raise only while output tokens/s grows by this share.")
    latency_factor: float = Field(2.0, ge=1, le=100, description="Step back when median latency exceeds this"
                                                                 " multiple of the lowest seen.")

    @model_validator(mode="after")
    def _check_range(self) -> AutotuneConfig:
        if self.min > self.max:
            raise ValueError(f"autotune.min ({self.min}) is above autotune.max ({self.max})")
        return self


JUDGE_TEMPLATE = (
    "You are grading one answer of a model. Read the conversation and the answer, then reply with a JSON object "
    "{\"score\": a number from 0 (useless) to 1 (excellent), \"label\": \"good\" or \"bad\", \"reason\": one "
    "short sentence}.\n\n### Conversation\n{prompt}\n\n### Answer\n{answer}\n")


class JudgeConfig(_Strict):
    """`[judge]`: a judge model grades finished records off the generation path (synthwatch.workers.judge)."""

    endpoint: EndpointConfig = Field(description="The judge's OpenAI-compatible endpoint (its own key variable).")
    model: str = Field(min_length=1, description="Model name sent to the judge.")
    prompt_template: str = Field(
        JUDGE_TEMPLATE, min_length=1, max_length=100_000,
        description="The judge's user message; {prompt}, {reasoning}, {answer} and {reference} are replaced.")
    reference_field: str = Field(
        "reference", min_length=1, max_length=200,
        description="The dataset row's field (a dotted path allowed) that {reference} reads; a template with "
        "{reference} refuses the run when the dataset has no such field.")
    sample_fraction: float = Field(1.0, gt=0, le=1, description="Share of ok records judged (1: all); which ones "
                                   "is drawn from the record id, so a resume judges the same ones.")
    concurrency: int = Field(4, ge=1, le=1000, description="Judge requests in flight at once (apart from the run's).")
    max_tokens: int = Field(512, ge=1, le=100_000, description="max_tokens of a judge request.")
    temperature: float = Field(0.0, ge=0, le=5, description="temperature of a judge request.")
    guided: Literal["auto", "json_schema", "none"] = Field(
        "auto", description="Ask for the verdict's JSON schema (response_format json_schema): auto asks and stops "
        "asking after the server refuses it (HTTP 400); json_schema always; none never. The reply is validated "
        "in every case.")
    bad_labels: list[str] = Field(default_factory=lambda: ["bad"], max_length=50,
                                  description="Labels that make the verdict a failure (the check fails).")
    min_score: float | None = Field(None, description="A score below this fails the verdict too.")
    timeout_s: float = Field(120.0, gt=0, description="Longest wait for one judge reply.")
    max_attempts: int = Field(3, ge=1, le=20, description="Attempts per record (timeouts, 429, 5xx) before the "
                              "verdict is the judge's error.")
    alarm_threshold: float = Field(0.2, ge=0, le=1, description="Alarm when this share of the last alarm_window "
                                   "judged records is bad.")
    alarm_window: int = Field(100, ge=1, le=100_000, description="Judged records the alarm rule looks back over.")
    alarm_min_records: int = Field(10, ge=1, description="Judged records needed before the alarm can fire.")
    auto_pause: bool = Field(False, description="The judge's alarm pauses the run (as a check's auto-pause).")
    drain_s: float = Field(120.0, ge=0, le=86_400, description="After the run's last record, how long the judge may "
                           "take to judge what is left before the process exits (the rest: synthwatch judge RUN).")


class RunConfig(_Strict):
    name: str | None = None
    dataset: DatasetConfig
    endpoints: list[EndpointConfig] = Field(min_length=1)
    model: str = Field(min_length=1)
    stream: bool = True
    request_token_ids: bool = Field(False, description="Ask vLLM for return_token_ids.")
    concurrency: int = Field(32, ge=1, le=100_000)
    cap: int | None = Field(None, ge=1, description="Stop once this many records are ok (records, not prompts: "
                            "with samples_per_prompt = k each sample is a record).")
    samples_per_prompt: int = Field(
        1, ge=1, le=1000, description="k answers per prompt, each its own record and request with a distinct seed "
        "(sampling.seed or 0, plus the sample index); pass@k and export --select read them per prompt.")
    samples_in_one_request: bool = Field(
        False, description="samples_per_prompt > 1: ask for a prompt's pending samples as one request with n = their "
        "count (one prefill on vLLM), each choice its own record; a server that answers fewer choices has the rest "
        "asked one request each. The seed is sampling.seed (or 0) plus the first sample's index.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    timeouts: TimeoutConfig = Field(default_factory=TimeoutConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    reasoning: ReasoningConfig = Field(default_factory=ReasoningConfig)
    tokenizer: TokenizerConfig | None = None
    pool: EndpointPoolConfig = Field(default_factory=EndpointPoolConfig)
    server_metrics: ServerMetricsConfig = Field(default_factory=ServerMetricsConfig)
    autotune: AutotuneConfig = Field(default_factory=AutotuneConfig)
    turns: Literal["last", "all"] = Field(
        "last", description="Multi-turn conversations: generate only the final answer from the dataset's history "
        "(last), or every assistant turn in order, each request carrying the model's own earlier answers (all).")
    history_reasoning: Literal["strip", "keep"] = Field(
        "strip", description="turns = all: the model's earlier reasoning is left out of later requests (strip, "
        "what DeepSeek/Qwen3 templates do with past turns) or sent back as reasoning_content (keep).")
    checks: dict[str, Any] = Field(default_factory=dict, description="Check and alarm settings.")
    judge: JudgeConfig | None = Field(None, description="A judge model that grades records (docs/checks.md).")
    webhook_url: str | None = None
    lease_s: float = Field(30.0, ge=2, description="A claim not renewed this long is taken over.")
    flush_interval_ms: int = Field(200, ge=10, le=10_000)
    shutdown_grace_s: float = Field(
        10.0, ge=0, le=3600, description="After the first SIGTERM or SIGINT, the longest in-flight requests may take "
        "to finish before they are interrupted (their records go back to pending).")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str | None) -> str | None:
        if v is not None:
            v = v.strip()
            if not v or len(v) > 200 or any(c in v for c in "\x00\n\r\t"):
                raise ValueError("run name must be 1-200 printable characters")
        return v

    @field_validator("checks")
    @classmethod
    def _check_checks(cls, v: dict[str, Any]) -> dict[str, Any]:
        # validated wherever a config is built (CLI, UI form, resume), not only when a worker starts
        try:
            CheckSettings.model_validate(v or {})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: "
                f"{unknown_key(CheckSettings, tuple(e['loc'])) if e['type'] == 'extra_forbidden' else e['msg']}"
                for e in exc.errors()
            )
            raise ValueError(problems) from None
        return v

    @model_validator(mode="after")
    def _check_endpoint_labels(self) -> RunConfig:
        labels = [e.label for e in self.endpoints]
        if len(set(labels)) != len(labels):
            raise ValueError(f"endpoints must be distinct (got {labels})")
        for e in self.endpoints:
            if e.api_key_env and any(h.lower() == "authorization" for h in e.headers_env):
                raise ValueError(f"endpoint {e.label}: give the key either as api_key_env or as an Authorization "
                                 "header in headers_env, not both")
        return self

    def request_body_base(self) -> dict[str, Any]:
        """What every chat request of this run carries besides its messages (the worker adds those per record)."""
        s = self.sampling
        body: dict[str, Any] = {"model": self.model, "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        for key in ("temperature", "top_p", "max_tokens", "seed", "stop"):
            v = getattr(s, key)
            if v is not None:
                body[key] = v
        if self.request_token_ids:
            body["return_token_ids"] = True
        if s.logprobs:
            body["logprobs"] = True
            if s.top_logprobs is not None:
                body["top_logprobs"] = s.top_logprobs
            if self.request_token_ids:  # vLLM names each logprob's token by its id (token_id:N), not its text
                body["return_tokens_as_token_ids"] = True
        body.update(s.extra_body)
        return body

    def sample_seed(self, sample_index: int) -> int | None:
        """The seed of a prompt's sample ``sample_index``: distinct per sample and deterministic, so a resumed or
        re-run sample asks the same; None when the run has one sample per prompt (the request keeps sampling.seed)."""
        if self.samples_per_prompt <= 1:
            return None
        return (self.sampling.seed or 0) + sample_index

    def snapshot(self) -> dict[str, Any]:
        """What is stored with the run: the whole config; keys appear only as env-var names."""
        return self.model_dump(mode="json")


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field's annotation holds (directly, optional, or in a list or dict), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _is_table(annotation: Any) -> bool:
    """A dict of entries (optional or not)."""
    return get_origin(annotation) is dict or any(get_origin(a) is dict for a in get_args(annotation))


def unknown_key(root: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    """"unknown key" for the key at ``loc``, with the nearest keys of its table when one is close (#37):
    `unknown key (did you mean concurrency?)` for `concurency`."""
    import difflib

    model: type[BaseModel] | None = root
    keyed = False  # the part before was a table of named entries (rules.<check>): this part is such a name
    for part in loc[:-1]:
        if isinstance(part, int) or model is None or keyed:
            keyed = False
            continue  # a list's item or a table's entry: the same model
        info = model.model_fields.get(str(part))
        model = _model_in(info.annotation) if info is not None else None
        keyed = info is not None and _is_table(info.annotation)
    if model is None or not loc:
        return "unknown key"
    names = [info.alias or name for name, info in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), names, n=2, cutoff=0.6)
    return f"unknown key (did you mean {' or '.join(close)}?)" if close else "unknown key"


def validation_problems(exc: ValidationError,
                        root: type[BaseModel] | None = None) -> list[tuple[tuple[str | int, ...], str]]:
    """(location, message) per problem, in words; a validator that checked a nested table and reported
    "sub.path: problem; ..." gives one problem per part, located under it."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = unknown_key(root or RunConfig, loc)
        if err["type"] == "value_error" and msg.startswith("Value error, "):
            msg = msg.removeprefix("Value error, ")
            if _NESTED_PROBLEM.match(msg):
                for part in msg.split("; "):
                    sub, _, text = part.partition(": ")
                    out.append(((*loc, *sub.split(".")), text))
                continue
        out.append((loc, msg))
    return out


def format_validation_error(exc: ValidationError, source: str, root: type[BaseModel] | None = None) -> str:
    lines = [f"invalid run configuration ({source}):"]
    for loc, msg in validation_problems(exc, root):
        lines.append(f"  {'.'.join(str(p) for p in loc) or '(top level)'}: {msg}")
    return "\n".join(lines)


def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None


def build_config(data: dict[str, Any], source: str) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source), validation_problems(exc)) from None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out
