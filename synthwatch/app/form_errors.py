"""Every problem of a submitted form at once, each beside its field.

A form's handler checks everything it can (its own parsing, the run configuration's validation, the
dashboard's limits on folders and key variables) and collects each problem with the form field it belongs
to; the page then shows them all: a summary at the top that links to the fields, and each message beside
its field (``aria-invalid`` and ``aria-describedby`` on the field), with the entered values kept.
Templates use the macros of ``_form_macros.html`` (a field's id is ``f-`` + its name with dots as dashes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Location = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    field: str | None  # the form field it belongs to; None: the form as a whole
    label: str  # what the summary calls it ("sampling.temperature", "dataset path")
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "label": self.label, "message": self.message}


class FormErrors(Exception):
    """The problems of one submitted form; raised once, after every check ran."""

    def __init__(self, problems: Iterable[Problem] = ()) -> None:
        super().__init__()
        self.problems: list[Problem] = list(problems)

    def add(self, field: str | None, label: str, message: str) -> None:
        self.problems.append(Problem(field, label, message))

    def has(self, field: str) -> bool:
        return any(p.field == field for p in self.problems)

    def add_validation(self, problems: Iterable[tuple[Location, str]], to_field: Callable[[Location, str], str | None],
                       skip: Iterable[str] = ()) -> None:
        """Problems of a RunConfig validation, each put to its field; a field in ``skip`` (already
        reported by the form's own parsing) gets no second message."""
        skipped = set(skip)
        for loc, msg in problems:
            field = to_field(loc, msg)
            if field is not None and field in skipped:
                continue
            self.add(field, ".".join(str(p) for p in loc) or "settings", msg)

    @property
    def fields(self) -> dict[str, list[str]]:
        """Field name -> its messages (the template shows them beside the field)."""
        out: dict[str, list[str]] = {}
        for p in self.problems:
            if p.field is not None:
                out.setdefault(p.field, []).append(p.message)
        return out

    def as_list(self) -> list[dict[str, Any]]:
        return [p.as_dict() for p in self.problems]

    def __bool__(self) -> bool:
        return bool(self.problems)

    def __str__(self) -> str:
        return "\n".join(f"{p.label}: {p.message}" for p in self.problems)
