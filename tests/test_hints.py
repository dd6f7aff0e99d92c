"""Every command synthwatch prints for a person works pasted into a new shell in the folder where it was printed (#37).

The hints are collected from where a person reads them: the CLI's own lines (probe's `run with:`, the PAUSED line,
the exit message, `fix`'s and the dashboard's hints), an alarm's fix, the pages, and the commands of the docs. For
each, its first word is looked up by a clean shell (`env -i PATH=… bash -c 'command -v WORD'`, no activated
.venv) in the folder where it was printed, and no placeholder (RUN, N, …) is left where the value is known. Some
are pasted whole and must do what they say. Hard-coded hints in the product's strings are refused: every one
comes from synthwatch.hints.command."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, cli_env, run_cli
from hypothesis import given
from hypothesis import strategies as st

from synthwatch import hints
from synthwatch.cli import build_parser

VENV_BIN = str(Path(sys.executable).parent)


def clean_path() -> str:
    """A new shell's PATH: this one's without the virtual environment (nobody activated it)."""
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != Path(VENV_BIN).resolve())


def clean_shell(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``command`` as a person pastes it into a new shell in ``cwd``: nothing inherited but PATH and HOME."""
    return subprocess.run(["env", "-i", f"PATH={clean_path()}", f"HOME={os.environ.get('HOME', '/')}",
                           *(f"{k}={v}" for k, v in env.items()), "bash", "-c", command],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def assert_found(command: str, cwd: Path) -> None:
    word = shlex.split(command)[0]
    found = clean_shell(f"command -v {shlex.quote(word)}", cwd)
    assert found.returncode == 0, f"{word!r} (of {command!r}) is not found by a new shell in {cwd}"


PLACEHOLDER = re.compile(r"(?<![\w-])(RUN|N|M|ID|FIELD|CHECK|…|\.\.\.|<[^>]*>)(?![\w-])")


def assert_filled(command: str, allowed: tuple[str, ...] = ()) -> None:
    left = [m.group(1) for m in PLACEHOLDER.finditer(command) if m.group(1) not in allowed]
    assert not left, f"placeholders {left} left in {command!r}"


def commands_in(text: str) -> list[str]:
    """The commands quoted in a text: `synthwatch …` or `…/synthwatch …` in backticks, or after "with:"/"terminal:"."""
    found = [c for c in re.findall(r"`([^`]+)`", text) if _is_command(c)]
    found += [m.strip() for m in re.findall(r"(?:terminal|go on|with|or): ([^|`]+?)(?: \||$)", text, flags=re.M)
              if _is_command(m.strip())]
    return found


def _is_command(text: str) -> bool:
    words = text.split()
    return bool(words) and (words[0] == "synthwatch" or words[0].endswith("/synthwatch")) and len(words) > 1


# ---------------------------------------------------------------------------------------------- the first word


def _program_in(env_path: str, cwd: Path) -> str:
    code = "from synthwatch.hints import command; print(command('serve', db='x.db'))"
    out = subprocess.run([sys.executable, "-c", code], env={**cli_env(), "PATH": env_path}, cwd=cwd,
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip()


def test_the_first_word_is_synthwatch_only_where_path_finds_this_installation(tmp_path: Path) -> None:
    own = hints.installed_program()
    assert own is not None, "the test environment has no synthwatch console script"
    ours, other, none = tmp_path / "ours", tmp_path / "other", tmp_path / "none"
    for d in (ours, other, none):
        d.mkdir()
    (ours / "synthwatch").symlink_to(own)  # what ./dev setup puts on PATH
    fake = other / "synthwatch"  # another installation's program
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    base = clean_path()
    assert _program_in(f"{ours}{os.pathsep}{base}", ROOT) == "synthwatch serve --db x.db"
    for path in (f"{other}{os.pathsep}{base}", f"{none}{os.pathsep}/usr/bin:/bin"):
        for cwd in (ROOT, tmp_path):
            line = _program_in(path, cwd)
            word = shlex.split(line)[0]
            assert word != "synthwatch", line
            assert Path(cwd, word).resolve() == own.resolve(), line  # relative to cwd inside it, else absolute
            done = clean_shell(line.replace(" serve --db x.db", " --help"), cwd)
            assert done.returncode == 0 and "usage: synthwatch" in done.stdout, done.stderr


@pytest.mark.slow  # ./dev setup, twice (nothing to install: seconds each)
def test_dev_setup_puts_a_launcher_on_path_and_says_where(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    path = f"{home}/.local/bin:/usr/bin:/bin"
    proc = subprocess.run(["env", "-i", f"HOME={home}", f"PATH={path}", "bash", str(ROOT / "dev"), "setup"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    link = home / ".local" / "bin" / "synthwatch"
    own = ROOT / ".venv" / "bin" / "synthwatch"
    assert link.is_symlink() and link.resolve() == own.resolve()
    assert f"synthwatch is on PATH: {link} -> {own}" in proc.stderr, proc.stderr
    # a new shell with that PATH runs it, and the hints it prints then start with the bare name
    shell = subprocess.run(["env", "-i", f"HOME={home}", f"PATH={path}", "bash", "-c",
                            "synthwatch --version && "
                            f"{own.parent / 'python'} -c 'from synthwatch.hints import program; print(program())'"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0 and shell.stdout.split("\n")[0].startswith("synthwatch "), shell.stderr
    assert shell.stdout.strip().splitlines()[-1] == "synthwatch", shell.stdout
    # no writable folder on PATH for it: said, and the hints print the path that works
    bare = subprocess.run(["env", "-i", f"HOME={tmp_path / 'nohome'}", "PATH=/usr/bin:/bin", "bash",
                           str(ROOT / "dev"), "setup"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert bare.returncode == 0, bare.stderr
    assert "type .venv/bin/synthwatch" in bare.stderr, bare.stderr


def test_the_database_is_named_without_its_password(tmp_path: Path) -> None:
    assert hints.command("serve", db="postgresql://u:s3cret@db.example:5432/d") == \
        f"{hints.program()} serve --db postgresql://u@db.example:5432/d"
    assert hints.command("serve", db="sqlite:///" + str(tmp_path / "a b.db")) == \
        f"{hints.program()} serve --db '{tmp_path / 'a b.db'}'"
    assert hints.command("control", "resume", run="my run", with_db=False) == \
        f"{hints.program()} control 'my run' resume"


_WORD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)


@given(run=_WORD, db=_WORD.filter(lambda d: "://" not in d and d.strip() == d and not d.startswith("~")),
       words=st.lists(_WORD, max_size=4))
def test_a_shell_reads_back_every_word_of_a_hint(run: str, db: str, words: list[str]) -> None:
    """Whatever the run's name, the database's path or the values: the shell splits the hint into the words
    meant, each one whole (quoted where it needs to be)."""
    line = hints.command("control", *words, run=run, db=db)
    head = shlex.split(hints.program())
    split = shlex.split(line)
    assert split[: len(head)] == head
    assert split[len(head):] == ["control", run, *words, "--db", hints.db_value(db)]


# -------------------------------------------------------------------------- no hint written outside hints.py


SUBCOMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
# a command line, not a command's name: arguments follow (a placeholder, a flag) or a value is put in (the end of
# an f-string's piece); `synthwatch run` named in a sentence, or "synthwatch run: error:", is not one
HARD_CODED = re.compile(r"\bsynthwatch (?:" + "|".join(SUBCOMMANDS) + r")(?= (?:[A-Z_]{2,}|N|M|--)|\s*$)")
IN_TEMPLATE = re.compile(r"\bsynthwatch (?:" + "|".join(SUBCOMMANDS) + r")(?= (?:[A-Z_]{2,}|N|M|--|\{\{))")


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string the code builds (f-string parts included), docstrings and comments left out."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
        if isinstance(node, ast.keyword) and node.arg in ("help", "description", "epilog", "reason"):
            # a flag's help names commands with their placeholders (`synthwatch control RUN pause`), an audit entry
            # the command that made it: references
            docs.update(id(n) for n in ast.walk(node.value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out.append((node.lineno, node.value))
    return out


def test_no_command_for_a_person_is_written_outside_the_hint_function() -> None:
    found = []
    for path in sorted((ROOT / "synthwatch").rglob("*.py")):
        if "migrations" in path.parts or path.name == "hints.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for lineno, s in _strings(tree):
            if HARD_CODED.search(s):
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {s[:100]!r}")
    for path in sorted((ROOT / "synthwatch" / "templates").glob("*.html")):
        text = re.sub(r"\{#.*?#\}", "", path.read_text(encoding="utf-8"), flags=re.S)
        for m in re.finditer(r"<code>([^<]*)</code>", text):
            if IN_TEMPLATE.search(m.group(1)):
                found.append(f"{path.relative_to(ROOT)}: {m.group(1)!r}")
    assert not found, "commands written by hand (use synthwatch.hints.command):\n" + "\n".join(found)


# --------------------------------------------------------------------------------------- the CLI's own hints


@pytest.mark.slow  # a run that pauses, and its hints pasted into new shells
def test_a_paused_runs_hints_are_filled_found_and_work_pasted(tmp_path: Path, sim: Any, prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_field="reasoning", reasoning_tokens="5", content_tokens="5")
    db = tmp_path / "p.db"
    proc = run_cli("run", "--dataset", str(prompts(300)), "--base-url", url, "--model", "sim-reasoner", "--db",
                   str(db), "--name", "story", "--reasoning-mode", "reasoning_content", "--concurrency", "4",
                   "--exit-on-pause", timeout=180)
    assert proc.returncode == 4, proc.stderr
    said = commands_in(proc.stderr)
    # the dashboard's start, the pause line's acknowledgement, the exit message's acknowledgement and run again
    assert len(said) >= 4, proc.stderr
    for command in said:
        assert_found(command, ROOT)
        assert_filled(command)
        assert f"--db {db}" in command, command
    # the alarm's fix names the run and the database: pasted, it sets the field the server sends
    checks = run_cli("checks", "story", "--db", str(db))
    fixes = [c for c in commands_in(checks.stdout) if " fix " in c]
    assert fixes, checks.stdout
    for command in commands_in(checks.stdout):
        assert_found(command, ROOT)
        assert_filled(command)
    ack = next(c for c in said if "--ack" in c)
    assert ack.split(" ", 1)[1] == f"control story resume --ack --for-records 100 --db {db}"
    done = clean_shell(ack, ROOT)  # pasted as printed, in a new shell
    assert done.returncode == 0, done.stdout + done.stderr
    assert "acknowledged alarm #1" in done.stderr and "desired = run" in done.stderr, done.stderr
    assert fixes[0].split(" ", 1)[1] == f"fix story --reasoning-mode reasoning --db {db}"
    fixed = clean_shell(fixes[0], ROOT)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    rederive = [c for c in commands_in(fixed.stdout) if " rederive " in c]
    assert rederive and clean_shell(rederive[0], ROOT).returncode == 0, fixed.stdout


@pytest.mark.slow  # probe, then its `run with:` line pasted
def test_probes_run_with_line_works_pasted(tmp_path: Path, sim: Any, prompts: Any) -> None:
    url = sim(seed=1, tokens_per_s=0, reasoning_tokens="5", content_tokens="5")
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("run with:"))
    command = line.removeprefix("run with:").strip()
    assert_found(command, ROOT)
    assert_filled(command)
    assert command.endswith(" --dataset FILE")  # the one value probe cannot know
    data = prompts(2)
    done = clean_shell(command.replace("--dataset FILE", f"--dataset {data} --db {tmp_path / 'r.db'} --quiet"),
                       ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_hint_of_run_names_this_database(tmp_path: Path, prompts: Any) -> None:
    db = tmp_path / "d.db"
    # no endpoint is needed to see the line: the preflight is skipped and the endpoint refuses at once
    proc = run_cli("run", "--dataset", str(prompts(1)), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--db", str(db), "--no-preflight", "--quiet", "--name", "h", timeout=120)
    start = [c for c in commands_in(proc.stderr) if " serve" in c]
    assert start, proc.stderr
    assert_found(start[0], ROOT)
    assert start[0].split(" ", 1)[1] == f"serve --db {db}"


# ---------------------------------------------------------------------------------------------- the pages


def test_pages_print_filled_commands_found_by_a_new_shell(tmp_path: Path, db_path: Path, live_app: Any,
                                                         sim: Any, prompts: Any) -> None:
    import httpx

    url = sim(seed=1, tokens_per_s=0, reasoning_tokens="5", content_tokens="5")
    done = run_cli("run", "--dataset", str(prompts(2)), "--base-url", url, "--model", "sim-reasoner",
                   "--db", str(db_path), "--name", "ended", "--quiet", "--cap", "1")
    assert done.returncode == 0, done.stderr
    srv = live_app()
    html = httpx.get(f"{srv.url}/runs/1", timeout=60).text
    codes = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<code>(.*?)</code>", html, flags=re.S)]
    import html as html_lib

    commands = [html_lib.unescape(c) for c in codes if _is_command(html_lib.unescape(c))]
    assert any(" run --name ended" in c for c in commands), codes
    for command in commands:
        assert_found(command, Path.cwd())  # the dashboard prints for the folder it runs in
        assert_filled(command)
        assert f"--db {hints.db_value(str(db_path))}" in command, command


# ------------------------------------------------------------------------------------------------ the docs


def _doc_commands() -> list[tuple[str, str]]:
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, flags=re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for ln in joined.splitlines():
                ln = ln.split("#", 1)[0].strip().removeprefix("$ ").strip()
                if ln:
                    out.append((path.name, ln))
        out += [(path.name, c) for c in re.findall(r"`([^`\n]+)`", text) if _is_command(c)]
    return out


def test_every_command_in_the_docs_starts_with_a_word_a_new_shell_finds() -> None:
    commands = _doc_commands()
    assert len(commands) > 30
    words = sorted({shlex.split(c)[0] for _, c in commands if c.split()[0] not in ("export", "cd")})
    missing = [w for w in words if clean_shell(f"command -v {shlex.quote(w)}", ROOT).returncode != 0]
    assert not missing, f"first words a new shell in the checkout does not find: {missing}; " + \
        "; ".join(f"{n}: {c}" for n, c in commands if shlex.split(c)[0] in missing)[:2000]
