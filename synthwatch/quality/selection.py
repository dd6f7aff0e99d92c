"""Verdicts are data (#38): one catalogue of the check names a run knows, and selection expressions over them.

Every place that names a check (export ``--exclude-check`` / ``--select-check`` / ``--where``, ``rerun`` and
``rederive --check``, the records filter, search, bulk actions, the repair page, the API) resolves the name here,
so a name is either known everywhere or refused everywhere with the same "did you mean".

**The catalogue** of a run (:func:`catalogue`) holds:

- the built-in checks (synthwatch.check_catalog.CHECK_NAMES): a bit of ``record.check_flags``, set when the record
  failed it, computed as the record is stored; their outcomes are ``pass`` and ``fail`` only;
- the extended checks the run's settings compute: verifiers (``verify_<kind>`` or their own name, also written
  ``verify:<kind>`` / ``verify:<name>``), user checks ``user:<name>``, TOML rules ``rule:<name>``, ``language``,
  ``near_duplicate``; and ``judge`` when the run has a judge model;
- every other check name with verdicts stored for the run (a check a later config version removed);

the extended checks and the judge have four outcomes, from their latest ``check_verdict`` row: ``pass``,
``fail``, ``error`` (the check itself failed on the record, e.g. over its time budget) and ``pending`` (no verdict
yet: the latest row is pending, or there is none).

**Expressions** (:func:`parse_where`), parsed with lark:

    expr   := expr "or" expr | expr "and" expr | "not" expr | "(" expr ")" | atom
    atom   := NAME "=" OUTCOME | NAME "!=" OUTCOME | NAME
    OUTCOME:= pass | fail | pending | error

``not`` binds tighter than ``and``, which binds tighter than ``or``; keywords and outcomes are case-insensitive. A
bare ``NAME`` means ``NAME=fail``, so ``not near_duplicate`` reads as "did not fail near_duplicate" (it passed, or
is pending, or errored). ``NAME!=OUTCOME`` is ``not NAME=OUTCOME``. Every name is resolved through the catalogue;
an unknown name, an outcome a check cannot have, or a syntax error raises :class:`WhereError` with the column.

The same expression gives an SQLAlchemy clause over ``record`` (:func:`where_clause`, SQLite and PostgreSQL) and a
Python answer for one record (:meth:`Where.evaluate`); a property test keeps the two equal.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from sqlalchemy import and_, column, false, func, literal, not_, or_, select, table, text, true
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.expression import FromClause

from ..check_catalog import BIT, CHECK_INFO, CHECK_NAMES, CheckSettings

OUTCOMES = ("pass", "fail", "pending", "error")
BUILTIN_OUTCOMES = ("pass", "fail")
JUDGE = "judge"  # the judge's verdicts are check_verdict rows of this check (synthwatch.workers.judge)
# kinds of catalogue entries
BUILTIN, VERIFIER, USER, RULE, LANGUAGE, NEAR_DUPLICATE, JUDGE_KIND, STORED = (
    "built-in", "verifier", "user", "rule", "language", "near_duplicate", "judge", "stored")
WHERE_MAX_CHARS = 2000
KNOWN_SHOWN = 60  # names listed in an error message at most


class UnknownCheck(ValueError):
    """A check name the run does not know; the message names it, where it came from, and the closest known."""

    def __init__(self, name: str, known: Sequence[str], source: str | None = None, column: int | None = None) -> None:
        self.name, self.source, self.known = name, source, tuple(known)
        close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
        self.suggestion = next((k for k in known if close and k.lower() == close[0]), None)
        at = f" at column {column}" if column is not None else ""
        where = f" ({source})" if source else ""
        hint = f"; did you mean {self.suggestion!r}?" if self.suggestion else ";"
        listed = ", ".join(known[:KNOWN_SHOWN]) + (", ..." if len(known) > KNOWN_SHOWN else "")
        super().__init__(f"unknown check {name[:60]!r}{at}{where}{hint} known checks: {listed}")


class WhereError(ValueError):
    """An expression that cannot be used; the message says what and at which column."""


@dataclass(frozen=True, slots=True)
class CheckEntry:
    name: str
    kind: str
    info: str
    configured: bool = True  # in the run's current settings (False: only verdicts stored for it)

    @property
    def outcomes(self) -> tuple[str, ...]:
        return BUILTIN_OUTCOMES if self.kind == BUILTIN else OUTCOMES

    @property
    def bit(self) -> int | None:
        return BIT[self.name] if self.kind == BUILTIN else None


@dataclass(frozen=True)
class Catalogue:
    """Every check name a run knows, with its kind; aliases (``verify:math``) map to a name."""

    entries: Mapping[str, CheckEntry]
    aliases: Mapping[str, str] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        """The canonical names: built-in first (in bit order), then extended, judge and stored ones."""
        return tuple(self.entries)

    @property
    def extended(self) -> tuple[str, ...]:
        """Names whose outcome is a stored verdict (everything but the built-in checks)."""
        return tuple(n for n, e in self.entries.items() if e.kind != BUILTIN)

    def __contains__(self, name: object) -> bool:
        try:
            self.resolve(str(name))
        except UnknownCheck:
            return False
        return True

    def resolve(self, name: str, source: str | None = None) -> str:
        """The canonical name for ``name`` (a name, an alias, either in any case); UnknownCheck otherwise.
        ``source`` (e.g. ``--exclude-check``) is named in the error."""
        n = str(name).strip()
        for cand in (n, n.lower()):
            if cand in self.entries:
                return cand
            if cand in self.aliases:
                return self.aliases[cand]
        raise UnknownCheck(n, [*self.entries, *self.aliases], source)

    def entry(self, name: str, source: str | None = None) -> CheckEntry:
        return self.entries[self.resolve(name, source)]

    def is_builtin(self, name: str) -> bool:
        return self.entry(name).kind == BUILTIN


def _config(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        cfg = orjson.loads(raw or "{}")
    except (orjson.JSONDecodeError, TypeError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def catalogue_of(config: Any, stored: Iterable[str] = ()) -> Catalogue:
    """The catalogue from a run's settings (its config snapshot: JSON text or a dict) and the check names with
    verdicts stored for it. Settings that do not validate give the built-in checks and the stored names only."""
    cfg = _config(config)
    entries: dict[str, CheckEntry] = {n: CheckEntry(n, BUILTIN, CHECK_INFO.get(n, "")) for n in CHECK_NAMES}
    aliases: dict[str, str] = {}
    raw_checks = cfg.get("checks")
    try:
        checks = CheckSettings.model_validate(raw_checks if isinstance(raw_checks, Mapping) else {})
    except ValueError:
        checks = CheckSettings.model_validate({})
    info = checks.extended_info()
    for v in checks.verifiers:
        entries.setdefault(v.check_name, CheckEntry(v.check_name, VERIFIER, info.get(v.check_name, "")))
        aliases.setdefault(f"verify:{v.kind}", v.check_name)
        if v.name:
            aliases.setdefault(f"verify:{v.name}", v.check_name)
    for u in checks.user:
        entries.setdefault(u.check_name, CheckEntry(u.check_name, USER, info.get(u.check_name, "")))
    for r in checks.rule:
        entries.setdefault(r.check_name, CheckEntry(r.check_name, RULE, info.get(r.check_name, "")))
    for name, kind in ((LANGUAGE, LANGUAGE), (NEAR_DUPLICATE, NEAR_DUPLICATE)):
        if name in info:
            entries.setdefault(name, CheckEntry(name, kind, info[name]))
    if cfg.get("judge"):
        entries.setdefault(JUDGE, CheckEntry(JUDGE, JUDGE_KIND, "the judge model's verdict on the answer"))
    for name in stored:
        if name and name not in entries:
            kind = (JUDGE_KIND if name == JUDGE else USER if name.startswith("user:") else
                    RULE if name.startswith("rule:") else STORED)
            entries[name] = CheckEntry(name, kind, "verdicts stored for the run (not in its current settings)",
                                       configured=False)
    for name in list(entries):
        if name.startswith("verify_"):
            aliases.setdefault("verify:" + name[len("verify_"):], name)
    return Catalogue(entries, {a: n for a, n in aliases.items() if a not in entries})


# the distinct check names of a run's verdicts, one index step each (ix_check_verdict_state: run, check, state),
# not a scan of every verdict
_STORED_NAMES = text(
    "WITH RECURSIVE n(name) AS (SELECT MIN(check_name) FROM check_verdict WHERE run_id = :r UNION ALL"
    " SELECT (SELECT MIN(check_name) FROM check_verdict WHERE run_id = :r AND check_name > n.name) FROM n"
    " WHERE n.name IS NOT NULL) SELECT name FROM n WHERE name IS NOT NULL")


def stored_names(conn: Any, run_id: int) -> list[str]:
    return [str(r[0]) for r in conn.execute(_STORED_NAMES, {"r": run_id})]


def catalogue(conn: Any, run_id: int) -> Catalogue:
    """The catalogue of one run: its settings' checks and the names of the verdicts stored for it.
    ``conn``: a SQLAlchemy Connection or Session. An unknown run has the built-in checks only."""
    raw = conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).scalar()
    return catalogue_of(raw, stored_names(conn, run_id))


# ----------------------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class Atom:
    name: str  # canonical
    outcome: str
    bit: int | None = None  # a built-in check's bit in record.check_flags (None: a stored verdict)


@dataclass(frozen=True, slots=True)
class Not:
    item: Node


@dataclass(frozen=True, slots=True)
class And:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple[Node, ...]


Node = Atom | Not | And | Or
_PREC = {Or: 1, And: 2, Not: 3, Atom: 4}


def _render(node: Node, outer: int = 0) -> str:
    if isinstance(node, Atom):
        return f"{node.name}={node.outcome}"
    prec = _PREC[type(node)]
    if isinstance(node, Not):
        s = "not " + _render(node.item, prec)
    else:
        sep = " and " if isinstance(node, And) else " or "
        s = sep.join(_render(i, prec) for i in node.items)
    return f"({s})" if prec < outer or (prec == outer and not isinstance(node, Not)) else s


def _atoms(node: Node) -> Iterable[Atom]:
    if isinstance(node, Atom):
        yield node
    elif isinstance(node, Not):
        yield from _atoms(node.item)
    else:
        for i in node.items:
            yield from _atoms(i)


@dataclass(frozen=True)
class Where:
    """A parsed, resolved expression. ``text`` is its normalised form (canonical names, ``name=outcome`` atoms,
    lower-case keywords, parentheses only where needed): what a manifest or an audit row records."""

    node: Node

    @property
    def text(self) -> str:
        return _render(self.node)

    @property
    def names(self) -> tuple[str, ...]:
        """The check names the expression reads, in order of first use."""
        return tuple(dict.fromkeys(a.name for a in _atoms(self.node)))

    @property
    def verdict_names(self) -> tuple[str, ...]:
        """The names it reads from stored verdicts (not from check_flags)."""
        return tuple(dict.fromkeys(a.name for a in _atoms(self.node) if a.bit is None))

    def evaluate(self, check_flags: int | None, states: Mapping[str, str]) -> bool:
        """The expression for one record: its check_flags and the latest verdict state per check name (a name
        missing from ``states`` is pending)."""
        flags = int(check_flags or 0)

        def ev(n: Node) -> bool:
            if isinstance(n, Atom):
                if n.bit is not None:
                    return ("fail" if flags & n.bit else "pass") == n.outcome
                return (states.get(n.name) or "pending") == n.outcome
            if isinstance(n, Not):
                return not ev(n.item)
            if isinstance(n, And):
                return all(ev(i) for i in n.items)
            return any(ev(i) for i in n.items)

        return ev(self.node)

    def __str__(self) -> str:
        return self.text


def check_is(cat: Catalogue, name: str, outcome: str = "fail", source: str | None = None) -> Where:
    """One atom: ``name`` (resolved in ``cat``; UnknownCheck otherwise) has ``outcome``; WhereError when the check
    cannot have that outcome (a built-in check is pass or fail only)."""
    entry = cat.entry(name, source)
    out = str(outcome).strip().lower()
    if out not in entry.outcomes:
        raise WhereError(_outcome_message(entry, outcome))
    return Where(Atom(entry.name, out, entry.bit))


def all_of(*items: Where) -> Where:
    """Every expression holds (an empty list: every record)."""
    nodes = [i.node for i in items]
    return Where(nodes[0] if len(nodes) == 1 else And(_flat(And, nodes))) if nodes else TRUE


def any_of(*items: Where) -> Where:
    nodes = [i.node for i in items]
    return Where(nodes[0] if len(nodes) == 1 else Or(_flat(Or, nodes))) if nodes else FALSE


def negate(item: Where) -> Where:
    return Where(Not(item.node))


TRUE = Where(And(()))  # and of nothing: every record
FALSE = Where(Or(()))  # or of nothing: no record


def excludes_failing(where: Where) -> tuple[str, ...]:
    """Checks whose every failing record the expression leaves out: top-level conditions ``NAME=pass`` or
    ``not NAME`` (an alarm on such a check need not hold an export made with it)."""
    items = where.node.items if isinstance(where.node, And) else (where.node,)
    out = [i.name for i in items if isinstance(i, Atom) and i.outcome == "pass"]
    out += [i.item.name for i in items if isinstance(i, Not) and isinstance(i.item, Atom) and i.item.outcome == "fail"]
    return tuple(dict.fromkeys(out))


def _flat(kind: type[And] | type[Or], nodes: Iterable[Node]) -> tuple[Node, ...]:
    out: list[Node] = []
    for n in nodes:
        out.extend(n.items if isinstance(n, kind) else (n,))
    return tuple(out)


def _outcome_message(entry: CheckEntry, outcome: str) -> str:
    if entry.kind == BUILTIN and str(outcome).lower() in OUTCOMES:
        return (f"built-in check {entry.name!r} is computed as the record is stored: its outcomes are pass and "
                f"fail, not {str(outcome)[:20]!r}")
    return f"unknown outcome {str(outcome)[:20]!r} for {entry.name!r}: one of {', '.join(entry.outcomes)}"


_GRAMMAR = r"""
?start: or_
?or_: and_ (_OR and_)*
?and_: not_ (_AND not_)*
?not_: _NOT not_ -> neg
     | atom
?atom: NAME "=" NAME -> is_
     | NAME "!=" NAME -> is_not
     | NAME -> bare
     | "(" or_ ")"
_OR.2: /or(?![\w.:\-])/i
_AND.2: /and(?![\w.:\-])/i
_NOT.2: /not(?![\w.:\-])/i
NAME: /[\w][\w.:\-]*/
%ignore /\s+/
"""

_PARSER: Lark | None = None


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        _PARSER = Lark(_GRAMMAR, parser="lalr", lexer="basic", maybe_placeholders=False)  # keywords are reserved
    return _PARSER


class _Build(Transformer[Token, Node]):
    def __init__(self, cat: Catalogue, source: str | None) -> None:
        super().__init__()
        self.cat, self.source = cat, source

    def _atom(self, name: Token, outcome: str, at: Token) -> Atom:
        try:
            entry = self.cat.entry(str(name))
        except UnknownCheck as exc:
            raise WhereError(str(UnknownCheck(exc.name, exc.known, column=name.column))) from None
        out = outcome.lower()
        if out not in entry.outcomes:
            raise WhereError(f"{_outcome_message(entry, outcome)} (at column {at.column})")
        return Atom(entry.name, out, entry.bit)

    @v_args(inline=True)
    def is_(self, name: Token, outcome: Token) -> Node:
        return self._atom(name, str(outcome), outcome)

    @v_args(inline=True)
    def is_not(self, name: Token, outcome: Token) -> Node:
        return Not(self._atom(name, str(outcome), outcome))

    @v_args(inline=True)
    def bare(self, name: Token) -> Node:
        return self._atom(name, "fail", name)

    @v_args(inline=True)
    def neg(self, item: Node) -> Node:
        return Not(item)

    def and_(self, items: list[Node]) -> Node:
        return And(_flat(And, items))

    def or_(self, items: list[Node]) -> Node:
        return Or(_flat(Or, items))


def _syntax_message(exc: UnexpectedInput, src: str) -> str:
    col = getattr(exc, "column", None)
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        return "the expression ends too early (a name, 'not' or '(' expected after the last word)"
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream if isinstance(exc.pos_in_stream, int) else -1
        ch = src[pos] if 0 <= pos < len(src) else "?"
        return f"unexpected character {ch!r} at column {col}"
    if isinstance(exc, UnexpectedToken):
        tok = str(exc.token)[:40]
        if exc.token.type == "NAME" and "NAME" not in exc.expected:
            return (f"unexpected {tok!r} at column {col}: 'and', 'or' or ')' expected between two conditions "
                    "(quote nothing; a name is a check, NAME=OUTCOME an outcome)")
        return f"unexpected {tok!r} at column {col}"
    return f"syntax error at column {col}"


def parse_where(src: str, cat: Catalogue, source: str | None = None) -> Where:
    """Parse and resolve an expression against a run's catalogue; WhereError says what is wrong and where."""
    where = f"{source}: " if source else ""
    s = str(src)
    if len(s) > WHERE_MAX_CHARS:
        raise WhereError(f"{where}the expression is longer than {WHERE_MAX_CHARS} characters")
    if not s.strip():
        raise WhereError(f"{where}empty expression: give a check name, e.g. 'verify_math=pass and not language'")
    try:
        tree = _parser().parse(s)
        node = _Build(cat, source).transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, WhereError):
            raise WhereError(f"{where}{exc.orig_exc}") from None
        raise
    except UnexpectedInput as exc:
        raise WhereError(f"{where}{_syntax_message(exc, s)} in {s[:120]!r}") from None
    except RecursionError:
        raise WhereError(f"{where}the expression nests too deeply") from None
    if isinstance(node, Token):  # a lone name, inlined by the grammar's ?rules
        node = _Build(cat, source).bare(node)
    return Where(node)


# ----------------------------------------------------------------------------------------------- SQL

RECORD = table("record", column("id"), column("run_id"), column("status"), column("check_flags"))
_VERDICT = table("check_verdict", column("id"), column("record_id"), column("check_name"), column("state"))


def latest_state(record: FromClause, name: str) -> ColumnElement[Any]:
    """The latest verdict state of check ``name`` for the record row, 'pending' when it has none (never NULL)."""
    return _latest(record.c.id, name)


def _latest(record_id: ColumnElement[Any], name: str) -> ColumnElement[Any]:
    v = _VERDICT.alias("cv")
    latest = (select(v.c.state).where(v.c.record_id == record_id, v.c.check_name == literal(name))
              .order_by(v.c.id.desc()).limit(1).scalar_subquery())
    return func.coalesce(latest, literal("pending"))


def _clause(where: Where, record_id: ColumnElement[Any], flags: ColumnElement[Any]) -> ColumnElement[bool]:
    def sql(n: Node) -> ColumnElement[bool]:
        if isinstance(n, Atom):
            if n.bit is not None:
                failed = func.coalesce(flags, 0).op("&")(n.bit) != 0
                return failed if n.outcome == "fail" else not_(failed)
            return _latest(record_id, n.name) == n.outcome
        if isinstance(n, Not):
            return not_(sql(n.item))
        if isinstance(n, And):
            return and_(true(), *(sql(i) for i in n.items)) if n.items else true()
        return or_(false(), *(sql(i) for i in n.items)) if n.items else false()

    return sql(where.node)


def where_clause(where: Where, record: FromClause | None = None) -> ColumnElement[bool]:
    """The expression as a WHERE clause over ``record`` (default: the table itself; pass an alias such as
    ``RECORD.alias("r")`` to join it). Never NULL: NOT of it is the complement. SQLite and PostgreSQL."""
    rec = RECORD if record is None else record
    return _clause(where, rec.c.id, rec.c.check_flags)


def record_ids(conn: Any, run_id: int, where: Where, *, status: str | None = None,
               max_id: int | None = None) -> list[int]:
    """The ids (ascending) of a run's records the expression selects; ``status`` (e.g. 'ok') and ``max_id`` narrow
    them. One statement; the caller owns the transaction."""
    q = select(RECORD.c.id).where(RECORD.c.run_id == run_id, where_clause(where))
    if status is not None:
        q = q.where(RECORD.c.status == status)
    if max_id is not None:
        q = q.where(RECORD.c.id <= max_id)
    return [int(r[0]) for r in conn.execute(q.order_by(RECORD.c.id))]


__all__ = ["BUILTIN", "BUILTIN_OUTCOMES", "FALSE", "JUDGE", "OUTCOMES", "RECORD", "TRUE", "And", "Atom", "Catalogue",
           "CheckEntry", "Not", "Or", "UnknownCheck", "Where", "WhereError", "all_of", "any_of", "catalogue",
           "catalogue_of", "check_is", "excludes_failing", "latest_state", "negate", "parse_where", "record_ids", "stored_names",
           "where_clause"]
