"""Secrets never leave the process: redaction of API keys and header values in text and in logs.

Every secret the process reads (an endpoint's API key, an extra header's value, a proxy's password) is
read through :func:`secret_from_env` or registered with :func:`add_secret`. :func:`redact` replaces each
registered value, and anything that looks like a bearer token (``Bearer <token>``), with ``[redacted]``;
error messages pass through it *before* they are cut to a length (:func:`clip`). The first registration
also installs redaction at the logging layer (applied to every log record the process creates, whichever
logger or handler it goes to), so that a message, an argument or a traceback holding a key never reaches a
log line, a terminal or a log file.

A server that echoes a key back rarely echoes it verbatim. Each character of a secret is matched in every
form a reply, a log or a page may give it (``_forms``): as is; JSON-escaped (``\\u00eb``, ``\\"``, ``\\/``);
as Python's repr shows str and bytes (``\\xe9``, ``\\xc3\\xa9``); percent-encoded (either hex case, ``+``
for a space); its UTF-8 bytes read as Latin-1 or cp1252 (mojibake, ``Ã«`` for ``ë``) or as U+FFFD; and
HTML-escaped; each in either case. Any mix of these forms matches, and so does a piece of at least :data:`FRAGMENT_CHARS`
characters at the start or at the end of a secret (what a server or a length limit leaves of a key cut
short). A key shorter than :data:`MIN_SECRET_CHARS` cannot be redacted without redacting ordinary words,
so it is refused at start-up (:func:`secret_problem`).

A key may also come back encoded (#34): a server that puts a request's headers in a base64 token or a hex
dump. Each secret's UTF-8 bytes are encoded once, when it is registered (:func:`encoded_forms`): base64
(standard and URL-safe alphabets; the characters that depend on the key alone, at each of the three
alignments the key can have inside a longer encoded string, so padding and neighbouring bytes do not
matter) and hex (either case). Those forms are matched verbatim.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
import unicodedata
from dataclasses import dataclass
from typing import Any

__all__ = ["FRAGMENT_CHARS", "MIN_SECRET_CHARS", "REDACTED", "RedactingFilter", "SecretError", "add_secret", "clip",
           "encoded_forms", "forget_secret", "header_value_problem", "install_log_redaction", "redact", "secret_from_env",
           "secret_problem"]

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8
"""Shortest API key or header value accepted: a shorter one would match ordinary text."""
FRAGMENT_CHARS = 8
"""A piece of a secret this long, at its start or its end, is redacted like the whole secret."""
_MIN_REGISTERED = 4  # a proxy password is not refused for its length; shorter than this it is not matched at all
# a bearer token as HTTP carries it: the scheme, then the token up to a space, quote or delimiter
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s'\",;)\]}]+")

_lock = threading.Lock()
_installed = False


class SecretError(Exception):
    """A secret's variable is unset or holds a value that cannot be used; the message names the variable only."""


# ------------------------------------------------------------------------------------------ checks


def header_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as an HTTP header value, or None if it can.

    HTTP carries visible ASCII, spaces, tabs and Latin-1 bytes (obs-text) in a field value; a line
    break or NUL would end the header and let the rest rewrite the request, and characters beyond
    Latin-1 (a zero-width space pasted along with a key) have no bytes a server would match."""
    for ch in value:
        o = ord(ch)
        if 32 <= o < 127 or o == 9 or 160 <= o < 256:
            continue
        if ch in "\r\n":
            return "a line break"
        if o == 0:
            return "a NUL character"
        if o > 255 and unicodedata.category(ch) not in ("Cf", "Cc", "Zs", "Zl", "Zp", "Cs", "Co", "Cn"):
            return "a character beyond Latin-1"  # a visible one: which one could be part of the secret
        name = unicodedata.name(ch, "control character")
        return f"U+{o:04X} ({name})"
    if value != value.strip(" \t"):
        return "white space at its start or end (HTTP strips it: the server would get another value)"
    return None


def secret_problem(value: str) -> str | None:
    """Why ``value`` cannot be used as an API key or header value, or None: what an HTTP header cannot carry,
    and a value too short to redact safely."""
    why = header_value_problem(value)
    if why is None and len(value) < MIN_SECRET_CHARS:
        why = (f"fewer than {MIN_SECRET_CHARS} characters, too short to keep out of logs and errors safely "
               "(it would match ordinary text)")
    return why


def secret_from_env(env: str, what: str = "the API key", environ: Any = None) -> str:
    """The value of environment variable ``env``, registered for redaction before anything can print it;
    SecretError (naming the variable, never the value) when it is unset or unusable."""
    value = (os.environ if environ is None else environ).get(env)
    if not value:
        raise SecretError(f"environment variable {env} is not set (it should hold {what})")
    add_secret(value)
    why = secret_problem(value)
    if why is not None:
        raise SecretError(f"environment variable {env} holds {why}, which cannot be used as {what}; fix the "
                          "variable (the value is not shown)")
    return value


# ------------------------------------------------------------------------------------------ forms


def _cases(s: str) -> set[str]:
    return {s.lower(), s.upper()}


def _forms(ch: str) -> set[str]:
    """Every way one character of a secret may be written in text that quotes it, in either case: a server that
    echoes a key upper- or lower-cased (a header name's habit applied to its value) still echoes the key."""
    forms = _char_forms(ch)
    for other in {ch.upper(), ch.lower()} - {ch}:
        # a mapping to several characters ("ß" → "SS") is matched as written; a single one in all its forms
        forms |= _char_forms(other) if len(other) == 1 else {other}
    return forms


def _char_forms(ch: str) -> set[str]:
    o = ord(ch)
    utf8 = ch.encode("utf-8", "surrogatepass")
    forms = {ch}
    # JSON string escapes (either hex case; astral characters as a surrogate pair)
    forms |= {'"': {'\\"'}, "\\": {"\\\\"}, "/": {"\\/"}, "\b": {"\\b"}, "\f": {"\\f"}, "\n": {"\\n"},
              "\r": {"\\r"}, "\t": {"\\t"}}.get(ch, set())
    if o < 0x10000:
        forms |= _cases(f"\\u{o:04x}")
    else:
        hi, lo = 0xD800 + ((o - 0x10000) >> 10), 0xDC00 + ((o - 0x10000) & 0x3FF)
        forms |= _cases(f"\\u{hi:04x}\\u{lo:04x}")
    # Python's repr of str (ascii) and of its bytes in UTF-8 or Latin-1
    if o < 0x20 or 0x7F <= o < 0x100:
        forms.add(f"\\x{o:02x}")
    elif o >= 0x10000:
        forms.add(f"\\U{o:08x}")
    if ch == "'":
        forms.add("\\'")
    if o >= 0x80:
        forms.add("".join(f"\\x{b:02x}" for b in utf8))
    # URL encoding (percent-encoded UTF-8, a space as +)
    forms |= _cases("".join(f"%{b:02x}" for b in utf8))
    if ch == " ":
        forms.add("+")
    if o >= 0x80:
        # its UTF-8 bytes read back as Latin-1 or cp1252 (mojibake), or not at all (one U+FFFD per byte or per char)
        for enc in ("latin-1", "cp1252"):
            try:
                forms.add(utf8.decode(enc))
            except UnicodeDecodeError:
                pass
        forms |= {"\ufffd", "\ufffd" * len(utf8)}
    forms |= {"&": {"&amp;"}, "<": {"&lt;"}, ">": {"&gt;"}, '"': {"&quot;", "&#34;"},
              "'": {"&#39;", "&#x27;", "&apos;"}}.get(ch, set())
    # an escaped form escaped once more (a JSON error quoted in JSON, a message logged with %r): backslash doubled
    forms |= {f.replace("\\", "\\\\") for f in forms if "\\" in f}
    return forms


def encoded_forms(value: str) -> set[str]:
    """The base64 (standard and URL-safe, at each alignment) and hex (either case) forms of a secret's UTF-8 bytes.

    For base64, the key's bytes are encoded after 0, 1 and 2 filler bytes, and only the characters whose six bits
    all come from the key are kept: the same characters appear in the base64 of any longer text holding the key
    at that alignment, whatever surrounds it, with or without padding."""
    raw = value.encode("utf-8", "surrogatepass")
    n = len(raw)
    out = {raw.hex(), raw.hex().upper()}
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + raw).decode("ascii")
        core = enc[-(-8 * k // 6): (8 * (k + n)) // 6]
        if len(core) >= MIN_SECRET_CHARS:
            out |= {core, core.replace("+", "-").replace("/", "_")}
    return out


def _unit(forms: set[str]) -> re.Pattern[str]:
    return re.compile("(?:" + "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)) + ")")


@dataclass(frozen=True)
class _Secret:
    """One secret's matchers: each character's forms, forwards and mirrored (for pieces at the secret's end)."""

    head: re.Pattern[str]  # the first characters (FRAGMENT_CHARS, or the whole of a shorter secret)
    units: tuple[re.Pattern[str], ...]
    tail: re.Pattern[str]  # the last characters, each form mirrored, searched in the mirrored text
    tail_units: tuple[re.Pattern[str], ...]  # from the last character backwards, mirrored
    encoded: re.Pattern[str] | None = None  # its base64 and hex forms (encoded_forms), matched verbatim

    @staticmethod
    def of(value: str) -> _Secret:
        per_char = [_forms(c) for c in value]
        n = min(FRAGMENT_CHARS, len(value))
        units = tuple(_unit(f) for f in per_char)
        mirrored = [{f[::-1] for f in forms} for forms in reversed(per_char)]
        tail_units = tuple(_unit(f) for f in mirrored)
        head = re.compile("".join(u.pattern for u in units[:n]))
        tail = re.compile("".join(u.pattern for u in tail_units[:n]))
        forms = encoded_forms(value)
        encoded = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))) if forms else None
        return _Secret(head, units, tail, tail_units, encoded)

    def spans(self, text: str) -> list[tuple[int, int]]:
        out = _extend(text, self.head, self.units)
        if len(self.units) > FRAGMENT_CHARS:  # a piece at the end; the whole secret is already found above
            rev = text[::-1]
            n = len(text)
            out += [(n - e, n - s) for s, e in _extend(rev, self.tail, self.tail_units)]
        if self.encoded is not None:
            out += [m.span() for m in self.encoded.finditer(text)]
        return out


def _extend(text: str, head: re.Pattern[str], units: tuple[re.Pattern[str], ...]) -> list[tuple[int, int]]:
    """Spans where ``head`` matches, each extended over as many of the following ``units`` as follow it."""
    out = []
    pos = 0
    n_head = min(FRAGMENT_CHARS, len(units))
    while (m := head.search(text, pos)) is not None:
        end = m.end()
        for unit in units[n_head:]:
            mm = unit.match(text, end)
            if mm is None:
                break
            end = mm.end()
        out.append((m.start(), end))
        pos = max(end, m.start() + 1)
    return out


_secrets: dict[str, _Secret] = {}


def add_secret(value: str) -> None:
    """Register a value that must never appear in logs, errors or stored data."""
    if len(value) < _MIN_REGISTERED:
        return
    with _lock:
        if value in _secrets:
            return
    compiled = _Secret.of(value)
    with _lock:
        _secrets[value] = compiled
    install_log_redaction()


def forget_secret(value: str) -> None:
    """Stop redacting ``value`` (a test's throwaway key; a process whose key was replaced)."""
    with _lock:
        _secrets.pop(value, None)


def redact(text: str) -> str:
    """``text`` with every registered secret (in any of its forms, or a piece cut from its start or end) and
    every bearer token replaced by ``[redacted]``."""
    if _secrets and text:
        spans: list[tuple[int, int]] = []
        for secret in list(_secrets.values()):
            spans += secret.spans(text)
        if spans:
            spans.sort()
            pieces, last = [], 0
            for s, e in spans:
                if e <= last:
                    continue  # inside a span already redacted
                if s >= last:
                    pieces += [text[last:s], REDACTED]
                last = e  # an overlapping span extends the redaction already written
            pieces.append(text[last:])
            text = "".join(pieces)
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(r"\1" + REDACTED, text)
    return text


def clip(text: str, n: int, more: str = "…") -> str:
    """``text`` redacted, then cut to ``n`` characters (``more`` appended when cut): redacting after the cut
    would miss a secret that the cut shortened."""
    text = redact(text)
    return text if len(text) <= n else text[:n] + more


# ------------------------------------------------------------------------------------------ logging


class RedactingFilter(logging.Filter):
    """Rewrites a log record's message, traceback and stack with secrets redacted; never drops it."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def redact_record(record: logging.LogRecord) -> None:
    try:
        msg = record.getMessage()
    except Exception:  # a bad format string: logging reports it later; keep the raw parts redacted
        record.msg = redact(str(record.msg))
        record.args = tuple(redact(str(a)) for a in record.args) if isinstance(record.args, tuple) else None
        return
    clean = redact(msg)
    if clean != msg or record.args:
        record.msg, record.args = clean, None
    if record.exc_info and not record.exc_text:
        record.exc_text = RedactingFilter._formatter.formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


def install_log_redaction() -> None:
    """Redact every log record this process creates, from now on (idempotent).

    Done in the record factory rather than on particular handlers: records reach handlers that
    other code adds later (uvicorn's, a test's), and a handler filter would miss them."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
