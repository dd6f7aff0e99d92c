"""Every command synthwatch prints for a person to type (#37) is written by :func:`command`, so that each one works
pasted into a new shell in the folder where it was printed:

- the first word is ``synthwatch`` only when that name, looked up on PATH, is this installation (``./dev setup``
  puts a launcher on PATH); otherwise it is the path of this installation's program, relative to the current
  folder when it lies inside it (``.venv/bin/synthwatch``), absolute otherwise;
- the run and the database are filled in (``--db`` names the database this process uses: a path as given, relative
  to the current folder inside it; an engine's ``sqlite:///`` URL as its absolute path; a PostgreSQL URL without
  its password, which psycopg then reads from PGPASSWORD or ~/.pgpass: a secret is never printed);
- every word is quoted for the shell.

It imports nothing from synthwatch, so every stage (quality, store, app, commands) may call it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

PLACEHOLDERS = ("RUN", "N", "M", "ID", "…", "...", "FIELD", "FILE", "URL")
"""Words a hint must not hold where the value is known (tests/test_hints.py looks for them)."""


def _relative(path: Path) -> str:
    """``path`` relative to the current folder when it lies inside it, else absolute."""
    try:
        cwd = Path.cwd()
    except OSError:  # the current folder was removed
        return str(path)
    try:
        rel = path.relative_to(cwd)
    except ValueError:
        return str(path)
    return str(rel) if rel.parts else "."


def installed_program() -> Path | None:
    """This installation's ``synthwatch`` program (the console script beside this Python), if there is one."""
    exe = Path(sys.executable)
    for folder in (exe.parent, Path(sys.prefix) / "bin"):
        candidate = folder / "synthwatch"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.absolute()
    return None


def program() -> str:
    """The first word of every hint: see the module's docstring."""
    own = installed_program()
    found = shutil.which("synthwatch")
    if own is not None and found is not None and Path(found).resolve() == own.resolve():
        return "synthwatch"
    if own is not None:
        return shlex.quote(_relative(own))
    # no console script (a checkout run with `python -m synthwatch` and no install): this Python and the module
    return f"{shlex.quote(_relative(Path(sys.executable).absolute()))} -m synthwatch"


def db_value(db: str | None) -> str | None:
    """What ``--db`` must say in a new shell for the database ``db`` names (None: the one this process uses by
    default, $SYNTHWATCH_DB or ./synthwatch.db); None when the default of a new shell finds it already."""
    raw = (db or os.environ.get("SYNTHWATCH_DB") or "").strip()
    if not raw:
        return None  # ./synthwatch.db: the default in this folder
    if raw.startswith("sqlite:///"):
        # a resolved URL (an engine's, a stored text's): its absolute path, which works from any folder (a page
        # or a stored status is read far from the folder of the process that wrote it)
        return raw[len("sqlite:///"):]
    if "://" in raw:
        parts = urlsplit(raw)
        if parts.password is not None:  # never print a secret: psycopg reads PGPASSWORD / ~/.pgpass instead
            host = parts.netloc.rsplit("@", 1)[1]
            user = parts.username or ""
            parts = parts._replace(netloc=f"{user}@{host}" if user else host)
        return urlunsplit(parts)
    path = Path(raw).expanduser()
    return _relative(path.absolute() if not path.is_absolute() else path)


def command(*words: object, run: str | None = None, db: str | None = None, with_db: bool = True) -> str:
    """A complete command line for a person: ``command("control", "resume", "--ack", run="story", db=path)`` is
    ``synthwatch control story resume --ack --db path``. ``run`` goes right after the subcommand (the first word);
    ``db`` (or this process's default database) is added as ``--db`` unless ``with_db`` is false (a command that
    opens no database: probe, simulate)."""
    args = [str(w) for w in words]
    if run is not None:
        args.insert(1 if args else 0, str(run))
    if with_db:
        value = db_value(db)
        if value is not None:
            args += ["--db", value]
    return " ".join([program(), *(shlex.quote(a) for a in args)])
