"""Secrets never leave the process: redaction of API keys and header values in text and in logs.

Every secret the worker reads (an endpoint's API key, an extra header's value) is registered
here with :func:`add_secret`. :func:`redact` replaces each registered value, and anything that
looks like a bearer token (``Bearer <token>``), with ``[redacted]``; error messages pass through
it before they are recorded. The first registration also installs redaction at the logging layer
(:class:`RedactingFilter`, applied to every log record the process creates, whichever logger or
handler it goes to), so that a message, an argument or a traceback holding a key never reaches a
log line, a terminal or a log file.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

__all__ = ["REDACTED", "RedactingFilter", "add_secret", "install_log_redaction", "redact"]

REDACTED = "[redacted]"
# a bearer token as HTTP carries it: the scheme, then the token up to a space, quote or delimiter
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s'\",;)\]}]+")
_MIN_SECRET = 4  # shorter values would redact ordinary words; such keys are refused anyway (none is that short)

_lock = threading.Lock()
_forms: tuple[str, ...] = ()  # each secret as it may appear in text, longest first
_installed = False


def _spellings(value: str) -> set[str]:
    """The ways ``value`` can show up in text: as is, and escaped as repr() shows str and bytes."""
    forms = {value, ascii(value)[1:-1]}
    for enc in ("utf-8", "latin-1"):
        try:
            forms.add(repr(value.encode(enc))[2:-1])
        except UnicodeEncodeError:
            pass
    return {f for f in forms if len(f) >= _MIN_SECRET}


def add_secret(value: str) -> None:
    """Register a value that must never appear in logs, errors or stored data."""
    global _forms
    if len(value) < _MIN_SECRET:
        return
    with _lock:
        forms = set(_forms) | _spellings(value)
        _forms = tuple(sorted(forms, key=len, reverse=True))
    install_log_redaction()


def redact(text: str) -> str:
    """``text`` with every registered secret and every bearer token replaced by ``[redacted]``."""
    for form in _forms:
        if form in text:
            text = text.replace(form, REDACTED)
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(r"\1" + REDACTED, text)
    return text


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
