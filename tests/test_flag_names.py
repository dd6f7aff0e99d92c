"""Flags and TOML keys share names (#27): every key of the run configuration has a `synthwatch run` flag named after
it (its path with hyphens: `timeouts.total_s` <-> `--timeouts-total-s`), and every flag of `synthwatch run` sets the
key of its name, or is not a run setting; the exceptions are listed here, each with its reason. Old flag names keep
working and print the new name once."""

from __future__ import annotations

import argparse
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from pydantic import BaseModel
from test_docs import _keys

from synthwatch.cli import build_parser
from synthwatch.commands.run import KEY_FLAGS, resolve_config
from synthwatch.config import DatasetConfig, RunConfig, options

DOCS = Path(__file__).resolve().parent.parent / "docs"

# tables whose flags are the key's own name without the table's
LEAF_TABLES = {
    "sampling": "its keys are the request body's own parameters (max_tokens, top_p, stop, seed, ...), spelt as the "
                "OpenAI API and every server spell them; the flag is that parameter's name",
    "endpoints[]": "a list: --base-url is repeated once per endpoint (a path would need an index); --api-key-env, "
                   "--price-in-per-mtok and --price-out-per-mtok apply to all of them",
    "dataset": "the dataset's flags are declared on DatasetConfig's fields (Option) and shared with the start-a-run "
               "form; `--split`, `--limit` read as what they are",
}
# keys whose flag has another name
EXCEPTIONS = {
    "dataset.path": ("--dataset", "the one input every run needs: `--dataset FILE`"),
    "dataset.seed": ("--shuffle-seed", "--seed is the sampling seed sent with each request (sampling.seed)"),
    "dataset.on_bad_line": ("--skip-bad-lines", "a switch that sets the value 'skip' ('error' is the default)"),
    "autotune.enabled": ("--concurrency auto", "turning the tuner on is choosing how many requests are in flight"),
    "tokenizer.name_or_path": ("--tokenizer", "the same flag on `export` and `tokens`, which take a tokenizer "
                               "without a run's settings"),
    "tokenizer.chat_template": ("--chat-template", "as --tokenizer: shared with `export` and `tokens`"),
    "tokenizer.trust_remote_code": ("--trust-remote-code", "as --tokenizer: shared with `export` and `tokens`"),
    "checks.near_duplicate.against": ("--dedup-against", "says what it does on the command line (dedup this run "
                                      "against a dataset) and turns the near-duplicate check on with it"),
}
# keys without a flag: set in the TOML file (or the dashboard's settings)
NO_FLAG = {
    "limits.": "safety bounds on a reply's size (docs/limits.md): changed rarely",
    "pool.": "when an endpoint is ejected from rotation: tuning",
    "server_metrics.": "scraping the servers' /metrics: on by default, tuning",
    "autotune.start": "the tuner's own tuning", "autotune.interval_s": "the tuner's own tuning",
    "autotune.gain": "the tuner's own tuning", "autotune.latency_factor": "the tuner's own tuning",
    "retries.backoff_": "the retry delays: tuning",
    "reasoning.think_": "a model's own think strings: set once per model (`synthwatch fix --reasoning-think-open` "
                        "changes them on a run)",
    "endpoints[].": "per-endpoint settings other than the URL and key: a flag would have to say which endpoint",
    "checks": "a table of per-check tables (docs/checks.md)",
    "webhook_url": "where alarms go for unattended runs: part of a deployment's TOML, not of a command",
    "lease_s": "multi-worker tuning", "flush_interval_ms": "the writer's tuning",
    "judge.": "a judge model is a second endpoint with its own template and alarm: a [judge] table in the TOML "
              "file (docs/checks.md), or `synthwatch judge RUN --config FILE`",
}
# flags of `synthwatch run` that are not run settings
NOT_SETTINGS = {
    "-h": "help", "--help": "help", "--db": "where runs are stored (SYNTHWATCH_DB), shared by every command",
    "--config": "the TOML file itself", "--join": "adds a worker to a run; no setting",
    "--new-config-version": "how a resume treats changed settings", "--reason": "kept with a config version",
    "--no-preflight": "skips a check before the run", "--quiet": "terminal output",
    "--exit-on-pause": "what this process does on a pause", "--log-json": "terminal output",
    "--metrics-port": "this worker's own metrics endpoint",
}


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def _canonical(key: str) -> set[str]:
    path = key.replace("[]", "")
    names = {path.replace(".", "-").replace("_", "-")}
    table = key.rpartition(".")[0]
    if table in LEAF_TABLES:
        names.add(path.rpartition(".")[2].replace("_", "-"))
    return {f"--{n}" for n in names} | {f"--no-{n}" for n in names}


def _flags() -> dict[str, str]:
    """key -> the `synthwatch run` flag that sets it."""
    out = dict(KEY_FLAGS)
    out.update({f"dataset.{name}": opt.flag for name, _i, opt in options(DatasetConfig)})
    return {k.replace("endpoints.", "endpoints[]."): v for k, v in out.items()}


def _no_flag(key: str) -> str | None:
    return next((why for prefix, why in NO_FLAG.items() if key == prefix or
                 (prefix.endswith((".", "_")) and key.startswith(prefix))), None)


def test_every_toml_key_has_a_flag_of_its_name() -> None:
    flags = _flags()
    run_flags = {s for a in _run_parser()._actions for s in a.option_strings}
    wrong = []
    for key in _keys(RunConfig):
        if key in EXCEPTIONS:
            assert flags.get(key) == EXCEPTIONS[key][0], key
            continue
        if key not in flags:
            assert _no_flag(key), f"{key}: no flag; add one (named {sorted(_canonical(key))[0]}) or say why not"
            continue
        if flags[key] not in _canonical(key):
            wrong.append(f"{key}: {flags[key]} (want {' or '.join(sorted(_canonical(key)))})")
        assert flags[key].split()[0] in run_flags, f"{flags[key]} is not a flag of synthwatch run"
    assert not wrong, "flags not named after their keys:\n" + "\n".join(wrong)
    assert {"--timeouts-total-s", "--timeouts-connect-s", "--timeouts-idle-s"} <= run_flags


def test_every_flag_sets_the_key_of_its_name_or_is_no_setting() -> None:
    """The other way round: each flag of `synthwatch run` (old names aside) names a key, or is not a setting."""
    from synthwatch.commands._common import OLD_FLAGS

    known = {f.split()[0] for f in _flags().values()}
    stray = [s for a in _run_parser()._actions for s in a.option_strings
             if s not in known and s not in NOT_SETTINGS and s not in OLD_FLAGS]
    assert not stray, f"flags that set no key and are not listed as no setting: {stray}"
    assert all(new in known for new in OLD_FLAGS.values() if new.startswith(("--timeouts", "--retries")))


def _field(key: str) -> Any:
    model: type[BaseModel] = RunConfig
    *parents, leaf = key.replace("[]", "").split(".")
    for p in parents:
        ann = model.model_fields[p].annotation
        model = next(t for t in (ann, *typing.get_args(ann), *[x for a in typing.get_args(ann)
                                                                for x in typing.get_args(a)])
                     if isinstance(t, type) and issubclass(t, BaseModel))
    return model.model_fields[leaf]


def _value_args(key: str, flag: str) -> tuple[list[str], Any]:
    """Arguments that give the flag a value other than the key's default, and that value."""
    f = _field(key)
    ann = f.annotation
    kinds = {t for t in (ann, *typing.get_args(ann)) if t is not type(None)}
    if flag.startswith("--no-"):
        return [flag], False
    if bool in kinds:
        return [flag], True
    if typing.get_origin(ann) is typing.Literal or any(typing.get_origin(k) is typing.Literal for k in kinds):
        lit = next(k for k in (ann, *kinds) if typing.get_origin(k) is typing.Literal)
        choice = next(c for c in typing.get_args(lit) if c != f.default)
        return [flag, str(choice)], choice
    if int in kinds:
        return [flag, "7"], 7
    if float in kinds:
        return [flag, "0.5"], 0.5
    if any(typing.get_origin(k) is list for k in kinds):
        return [flag, "END"], ["END"]
    return [flag, "X_VALUE"], "X_VALUE"


def _get(config: Any, key: str) -> Any:
    node: Any = config
    for part in key.replace("[]", "").split("."):
        node = node[0] if isinstance(node, list) else node
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("key", sorted(k for k in _flags() if k not in EXCEPTIONS and k not in (
    "dataset.format", "sampling.extra_body", "concurrency", "endpoints[].base_url", "name")))
def test_the_flag_of_a_keys_name_sets_that_key(key: str) -> None:
    flag = _flags()[key]
    extra, want = _value_args(key, flag)
    base = ["run", "--dataset", "p.jsonl", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    if key.startswith("reasoning.prefilled") or key.startswith("tokenizer."):
        base += ["--tokenizer", "deepseek-v4"]
    if key == "sampling.seed":
        want = 7
    a = build_parser().parse_args(base + extra)
    assert _get(resolve_config(a), key) == want


def test_old_flag_names_still_work_and_say_the_new_name_once(tmp_path: Path) -> None:
    proc = run_cli("run", "--dataset", str(tmp_path / "none.jsonl"), "--base-url", "http://127.0.0.1:9/v1",
                   "--model", "m", "--db", str(tmp_path / "x.db"), "--timeout-s", "5", "--timeout-s", "6",
                   "--max-attempts", "2", "--no-expect-reasoning", "--concurrency-min", "2")
    assert proc.returncode == 2 and "no such file" in proc.stderr, proc.stderr  # parsed; the file is next
    assert proc.stderr.count("note: --timeout-s is now --timeouts-total-s") == 1, proc.stderr
    for old, new in (("--max-attempts", "--retries-max-attempts"), ("--no-expect-reasoning", "--no-reasoning-expect"),
                     ("--concurrency-min", "--autotune-min")):
        assert f"note: {old} is now {new}" in proc.stderr, proc.stderr
    # an old name's error names the TOML key of the flag it stands for
    proc = run_cli("run", "--dataset", "p.jsonl", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--idle-timeout-s", "soon")
    assert "argument --idle-timeout-s (timeouts.idle_s in a TOML file)" in proc.stderr, proc.stderr
    a = build_parser().parse_args(["run", "--dataset", "p.jsonl", "--base-url", "http://h/v1", "--model", "m",
                                   "--connect-timeout-s", "3", "--prefilled-think", "--tokenizer", "deepseek-v4"])
    config = resolve_config(a)
    assert config.timeouts.connect_s == 3 and config.reasoning.prefilled_open is True


def test_the_docs_name_each_keys_flag() -> None:
    """docs/configuration.md's table gives each key the flag the parser has (not an old name)."""
    text = (DOCS / "configuration.md").read_text()
    for key, flag in _flags().items():
        row = re.search(rf"^\| `{re.escape(key)}` \|[^|]*\| ([^|]*) \|", text, re.M)
        if row is None:
            continue  # the dataset's keys are documented in their own table
        assert f"`{flag}" in row.group(1), (key, flag, row.group(1))


def test_fix_flags_are_named_after_their_keys_and_old_names_work() -> None:
    """`synthwatch fix` sets the same keys: its flags have the names `run` has (old names still parse)."""
    from synthwatch.commands._common import OLD_FLAGS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    fix = sub.choices["fix"]
    named = {n for k in _keys(RunConfig) for n in _canonical(k)} | {f.split()[0] for f in _flags().values()}
    stray = [s for a in fix._actions for s in a.option_strings
             if s not in named and s not in OLD_FLAGS and s not in ("-h", "--help", "--db", "--set", "--reason")]
    assert not stray, stray
    a = build_parser().parse_args(["fix", "r", "--think-open", "<t>", "--expect-reasoning", "--timeout-s", "9"])
    b = build_parser().parse_args(["fix", "r", "--reasoning-think-open", "<t>", "--reasoning-expect",
                                   "--timeouts-total-s", "9"])
    assert vars(a) == vars(b) and a.think_open == "<t>" and a.expect is True and a.timeout_s == 9
    c = build_parser().parse_args(["fix", "r", "--no-prefilled-think", "--no-expect-reasoning"])
    assert c.prefilled is False and c.expect is False
