"""`synthwatch run`: load a dataset into a run (or resume it) and generate."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from ..capture.reasoning import MODES as REASONING_MODES
from ..cli import CliError
from ..config import DatasetConfig
from ..hints import command as hint
from ..sources.load import RunLoadError, prepare_run
from ._common import (
    OLD_FLAGS,
    add_db_arg,
    add_flag,
    add_option_flags,
    dashboard_hint,
    json_object_flag,
    option_values,
    positive_float,
    positive_int,
)
from .progress import Progress

ACK_RECORDS = 100
"""The number of records a printed acknowledgement suggests (a check's default window: #37)."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run",
        help="generate: send a dataset's prompts to endpoints and store every result",
        description="Settings come from --config (TOML, same keys as docs/configuration.md) and flags; "
        "flags win. A run whose name exists is resumed: nothing is loaded twice or redone.",
    )
    add_db_arg(p)
    # a flag's own error ("argument --cap: must be at least 1") also names the TOML key it sets, as a key's error
    # names its flag (with_flags)
    plain_error = p.error

    def error(message: str) -> NoReturn:
        plain_error(with_key(message))
        raise SystemExit(2)  # not reached: argparse's error exits

    p.error = error  # type: ignore[method-assign]
    p.add_argument("--config", help="TOML file with the run settings")
    p.add_argument("--name", help="run name (default: <dataset>-<model>-<6 hex of the dataset's path, the endpoints "
                   "and the model>, so the same command again resumes); an existing name resumes")
    p.add_argument("--join", metavar="RUN", help="add this worker to a run in progress (shares its queue)")
    p.add_argument("--new-config-version", action="store_true",
                   help="resuming with settings that differ from the run's: make them a new config version "
                   "(without it such a resume is refused, listing the differences)")
    p.add_argument("--reason", help="with --new-config-version: why (kept with the version)")
    add_option_flags(p.add_argument_group("dataset"), DatasetConfig)
    g = p.add_argument_group("endpoints and requests")
    g.add_argument("--base-url", action="append", help="OpenAI-compatible base URL; repeat for several")
    g.add_argument("--api-key-env", help="name of the environment variable holding the API key")
    g.add_argument("--model", help='the served model name (model)')
    for side, what in (("in", "prompt"), ("out", "completion")):  # named as the TOML keys they set
        g.add_argument(f"--price-{side}-per-mtok", type=float, metavar="PRICE", help=f"price per million {what} "
                       f"tokens of every endpoint (endpoints[].price_{side}_per_mtok): the cost view")
    g.add_argument("--no-stream", dest="stream", action="store_false", default=None,
                   help='send non-streamed requests (stream = false)')
    g.add_argument("--concurrency", type=concurrency_arg, metavar="N|auto",
                   help="requests in flight; 'auto' tunes it to the servers (autotune in docs/configuration.md)")
    add_flag(g, "--autotune-min", "--concurrency-min", type=positive_int, help="--concurrency auto: fewest in flight")
    add_flag(g, "--autotune-max", "--concurrency-max", type=positive_int, help="--concurrency auto: most in flight")
    g.add_argument("--cap", type=positive_int, help="stop once this many records are ok (records, not prompts: with "
                   "--samples-per-prompt K each sample counts)")
    g.add_argument("--samples-per-prompt", type=positive_int, metavar="K",
                   help="K answers per prompt, each its own record and request with a distinct seed (--seed or 0, "
                   "plus the sample index); pass@k on the dashboard, export --select per prompt (docs/samples.md)")
    g.add_argument("--dedup-against", metavar="FILE", help="check the answers against an existing dataset (JSONL or "
                   "Parquet): a near-duplicate of one of its rows fails near_duplicate; its index is kept beside the "
                   "database (checks.near_duplicate.against; docs/checks.md)")
    g.add_argument("--samples-in-one-request", action="store_true", default=None,
                   help="--samples-per-prompt K: ask for a prompt's samples as one request with n = K (one prefill "
                   "on vLLM; `synthwatch probe` says whether the server supports n)")
    g.add_argument("--max-tokens", type=positive_int, help='max_tokens of each request (sampling.max_tokens)')
    g.add_argument("--temperature", type=float, help='sampling temperature (sampling.temperature)')
    g.add_argument("--top-p", type=float, help='nucleus sampling top_p (sampling.top_p)')
    g.add_argument("--seed", type=int, help="sampling seed sent with each request")
    g.add_argument("--stop", action="append", help="stop string; repeat for several")
    g.add_argument("--logprobs", action="store_true", default=None,
                   help="ask for each completion token's logprob, stored packed and exported with --format tokens "
                   "(sampling.logprobs)")
    g.add_argument("--top-logprobs", type=int, metavar="K",
                   help="the K most likely alternatives per token too, 0-20; implies --logprobs (sampling.top_logprobs)")
    g.add_argument("--extra-body", help='JSON merged into each request, e.g. \'{"chat_template_kwargs": {...}}\'')
    g.add_argument("--turns", choices=["last", "all"],
                   help="multi-turn conversations: generate only the final answer (last, the default) or every "
                   "assistant turn in order, each request carrying the model's own earlier answers (all)")
    g.add_argument("--history-reasoning", choices=["strip", "keep"],
                   help="--turns all: leave the model's earlier reasoning out of later requests (strip, the "
                   "default) or send it back as reasoning_content (keep)")
    add_flag(g, "--request-token-ids", "--return-token-ids", action="store_true", default=None,
             help="ask the server (vLLM) for the exact prompt and completion token ids "
             "(`export --for speculators` needs them, or a --tokenizer)")
    g = p.add_argument_group("timeouts and retries")
    add_flag(g, "--timeouts-connect-s", "--connect-timeout-s", type=positive_float, help="TCP connect timeout")
    add_flag(g, "--timeouts-total-s", "--timeout-s", type=positive_float, help="total time for one request")
    add_flag(g, "--timeouts-idle-s", "--idle-timeout-s", type=positive_float, help="longest silence between chunks")
    add_flag(g, "--retries-max-attempts", "--max-attempts", type=positive_int, help="attempts per record")
    g.add_argument("--shutdown-grace-s", type=float, metavar="S",
                   help="after the first SIGTERM or SIGINT, how long in-flight requests may take to finish before they"
                   " are interrupted and their records go back to pending (default 10; a second signal stops at once)")
    g = p.add_argument_group("reasoning and tokenizer")
    g.add_argument("--reasoning-mode", choices=REASONING_MODES,
                   help='where the server puts the reasoning; auto looks everywhere (reasoning.mode)')
    add_flag(g, "--no-reasoning-expect", "--no-expect-reasoning", dest="reasoning_expect", action="store_false",
             default=None, help="the model does not reason: empty reasoning is not a defect")
    add_flag(g, "--reasoning-prefilled-open", "--prefilled-think", "--prefilled-open", action="store_true",
             default=None, help="the chat template already opens the think block in the prompt")
    g.add_argument("--tokenizer", help="tokenizer folder or cached name ('deepseek-v4' is shipped)")
    g.add_argument("--chat-template", help="chat template file (.jinja) or 'deepseek-v4'")
    g.add_argument("--trust-remote-code", action="store_true", default=None,
                   help='let the tokenizer run its own code (tokenizer.trust_remote_code)')
    g.add_argument("--no-preflight", dest="preflight", action="store_false",
                   help="skip the endpoint check before the run starts (GET /models: reachable, key accepted, "
                   "model served); for an endpoint that is not up yet")
    g = p.add_argument_group("output")
    g.add_argument("--quiet", action="store_true", help="no progress line (a pause is still said, once)")
    g.add_argument("--exit-on-pause", action="store_true",
                   help="when the run is paused (an alarm or `synthwatch control RUN pause`), exit with code 4 "
                   "instead of waiting for a resume; the run stays paused (for scripts)")
    g.add_argument("--log-json", action="store_true", help="progress as JSON lines on stdout (non-interactive)")
    g.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve this worker's own Prometheus metrics on 127.0.0.1:PORT (0: any free port; docs/metrics.md)")
    p.set_defaults(func=handle)


def concurrency_arg(value: str) -> int | str:
    return "auto" if value.strip().lower() == "auto" else positive_int(value)


def _flags_to_config(a: argparse.Namespace) -> dict[str, Any]:
    """Only the flags the user gave, shaped like the TOML file."""
    cfg: dict[str, Any] = {}

    def put(path: str, value: Any) -> None:
        if value is None:
            return
        node = cfg
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    put("name", a.name)
    for key, value in option_values(a, DatasetConfig).items():
        put(f"dataset.{key}", value)
    if a.base_url:
        cfg["endpoints"] = [{"base_url": u, **({"api_key_env": a.api_key_env} if a.api_key_env else {})}
                            for u in a.base_url]
    elif a.api_key_env:
        cfg["_api_key_env"] = a.api_key_env
    prices = {k: v for k, v in (("price_in_per_mtok", a.price_in_per_mtok),
                                ("price_out_per_mtok", a.price_out_per_mtok)) if v is not None}
    if prices:  # every endpoint's, as --api-key-env
        cfg["_prices"] = prices
    put("model", a.model)
    put("stream", a.stream)
    if a.concurrency == "auto":
        put("autotune.enabled", True)
    else:
        put("concurrency", a.concurrency)
    put("autotune.min", a.autotune_min)
    put("autotune.max", a.autotune_max)
    put("cap", a.cap)
    put("samples_per_prompt", a.samples_per_prompt)
    if a.dedup_against:  # stored absolute: a resume from another folder reads the same file
        put("checks.near_duplicate.against", str(Path(a.dedup_against).expanduser().absolute()))
        put("checks.near_duplicate.enabled", True)
    put("samples_in_one_request", a.samples_in_one_request)
    put("sampling.max_tokens", a.max_tokens)
    put("sampling.temperature", a.temperature)
    put("sampling.top_p", a.top_p)
    put("sampling.seed", a.seed)
    put("sampling.stop", a.stop)
    # --top-logprobs K asks for logprobs too (the API refuses top_logprobs without logprobs = true)
    put("sampling.logprobs", True if a.top_logprobs is not None and a.logprobs is None else a.logprobs)
    put("sampling.top_logprobs", a.top_logprobs)
    if a.extra_body:
        put("sampling.extra_body", json_object_flag(a.extra_body, "--extra-body"))
    put("request_token_ids", a.request_token_ids)
    put("turns", a.turns)
    put("history_reasoning", a.history_reasoning)
    put("timeouts.connect_s", a.timeouts_connect_s)
    put("timeouts.total_s", a.timeouts_total_s)
    put("timeouts.idle_s", a.timeouts_idle_s)
    put("retries.max_attempts", a.retries_max_attempts)
    put("shutdown_grace_s", a.shutdown_grace_s)
    put("reasoning.mode", a.reasoning_mode)
    put("reasoning.expect", a.reasoning_expect)
    put("reasoning.prefilled_open", a.reasoning_prefilled_open)
    put("tokenizer.name_or_path", a.tokenizer)
    put("tokenizer.chat_template", a.chat_template)
    put("tokenizer.trust_remote_code", a.trust_remote_code)
    return cfg


def read_toml(a: argparse.Namespace) -> dict[str, Any] | None:
    """--config's TOML, read first: a missing or bad file is reported before anything is opened or written."""
    from ..config import ConfigError, load_toml

    if not a.config:
        return None
    try:
        return load_toml(a.config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def resolve_config(a: argparse.Namespace, stored: dict[str, Any] | None = None, toml: dict[str, Any] | None = None,
                   *, required: bool = True) -> Any:
    """The run config from the stored one (resume), --config and the flags; None when something is missing and
    not ``required`` (a resume by --name alone fills it from the stored run)."""
    from ..config import ConfigError, build_config, deep_merge

    base: dict[str, Any] = dict(stored or {})
    source = "command line"
    if a.config:
        base = deep_merge(base, toml if toml is not None else (read_toml(a) or {}))
        source = f"{a.config} + command line"
    flags = _flags_to_config(a)
    key_env = flags.pop("_api_key_env", None)
    prices = flags.pop("_prices", {})
    merged = deep_merge(base, flags)
    if key_env and merged.get("endpoints"):
        merged["endpoints"] = [{**e, "api_key_env": key_env} for e in merged["endpoints"]]
    if prices and merged.get("endpoints"):
        merged["endpoints"] = [{**e, **prices} for e in merged["endpoints"]]
    missing = [k for k in ("dataset", "endpoints", "model") if k not in merged]
    if missing:
        if not required:
            return None
        flag = {"dataset": "--dataset", "endpoints": "--base-url", "model": "--model"}
        raise CliError("missing " + ", ".join(f"{k} ({flag[k]} or in --config)" for k in missing))
    try:
        return build_config(merged, source)
    except ConfigError as exc:
        raise CliError(with_flags(exc)) from None


# run settings (TOML keys, docs/configuration.md) and the `synthwatch run` flag that sets each, named after the key
# (tests/test_flag_names.py holds the rule and its exceptions): an error naming a key names its flag too (the
# dataset's flags come from DatasetConfig's Options)
KEY_FLAGS = {
    "endpoints.base_url": "--base-url", "endpoints.api_key_env": "--api-key-env", "model": "--model",
    "stream": "--no-stream", "request_token_ids": "--request-token-ids", "concurrency": "--concurrency",
    "cap": "--cap", "samples_per_prompt": "--samples-per-prompt",
    "samples_in_one_request": "--samples-in-one-request", "sampling.max_tokens": "--max-tokens", "sampling.temperature": "--temperature",
    "sampling.top_p": "--top-p", "sampling.seed": "--seed", "sampling.stop": "--stop",
    "sampling.logprobs": "--logprobs", "sampling.top_logprobs": "--top-logprobs",
    "sampling.extra_body": "--extra-body", "turns": "--turns", "history_reasoning": "--history-reasoning",
    "timeouts.connect_s": "--timeouts-connect-s", "timeouts.total_s": "--timeouts-total-s",
    "timeouts.idle_s": "--timeouts-idle-s", "retries.max_attempts": "--retries-max-attempts",
    "reasoning.mode": "--reasoning-mode", "reasoning.expect": "--no-reasoning-expect",
    "reasoning.prefilled_open": "--reasoning-prefilled-open", "tokenizer.name_or_path": "--tokenizer",
    "tokenizer.chat_template": "--chat-template", "tokenizer.trust_remote_code": "--trust-remote-code",
    "autotune.min": "--autotune-min", "autotune.max": "--autotune-max", "autotune.enabled": "--concurrency auto",
    "name": "--name", "shutdown_grace_s": "--shutdown-grace-s",
    "checks.near_duplicate.against": "--dedup-against",
    "endpoints.price_in_per_mtok": "--price-in-per-mtok", "endpoints.price_out_per_mtok": "--price-out-per-mtok",
}


def flag_for(loc: tuple[str | int, ...]) -> str | None:
    from ..config import options

    key = ".".join(str(p) for p in loc if not isinstance(p, int))
    if key.startswith("dataset."):
        return next((opt.flag for name, _i, opt in options(DatasetConfig) if f"dataset.{name}" == key), None)
    return KEY_FLAGS.get(key)


def with_key(message: str) -> str:
    """argparse's "argument --cap: …" with the TOML key the flag sets: "argument --cap (cap in a TOML file): …"."""
    import re

    m = re.match(r"argument (--[\w-]+)(?:/[^:]*)?: ", message)
    if m is None:
        return message
    flag = m.group(1)
    keys = [k for k, f in KEY_FLAGS.items() if f == OLD_FLAGS.get(flag, flag)]
    return message if not keys else message.replace(flag, f"{flag} ({keys[0]} in a TOML file)", 1)


def with_flags(exc: Any) -> str:
    """A ConfigError's message with each problem's flag after its key ("  cap: … (--cap)")."""
    lines = str(exc).splitlines()
    for loc, _msg in exc.problems:
        flag = flag_for(loc)
        if flag is None:
            continue
        head = "  " + ".".join(str(p) for p in loc) + ": "
        lines = [ln + f" ({flag})" if ln.startswith(head) and not ln.endswith(f"({flag})") else ln for ln in lines]
    return "\n".join(lines)


def check_before_writing(config: Any, *, dataset: bool, preflight: bool) -> None:
    """Everything that can be known wrong before a run is created: the dataset file, the key variables, and
    (unless --no-preflight) each endpoint, asked the way `synthwatch probe` asks (GET /models)."""
    import os
    from pathlib import Path

    from ..workers.endpoints import EndpointPool, MissingApiKey
    from ..workers.preflight import PreflightError, check_run_endpoints

    refuse_unloadable_checks(config.checks)
    if dataset:
        path = Path(config.dataset.path).expanduser()
        if not path.exists():
            raise CliError(f"dataset {config.dataset.path}: no such file or directory (--dataset, or path under "
                           "[dataset] in --config)")
        if not os.access(path, os.R_OK):
            raise CliError(f"dataset {config.dataset.path}: cannot read it (permission denied)")
    try:
        if preflight:
            check_run_endpoints(config, timeout_s=max(10.0, config.timeouts.connect_s))
        else:
            EndpointPool(config.endpoints, config.pool)  # the key variables at least
    except MissingApiKey as exc:
        raise CliError(f"{exc} (--api-key-env NAME, or api_key_env under [[endpoints]])") from None
    except PreflightError as exc:
        raise CliError(f"preflight: {exc} (--no-preflight skips this check)") from None


def refuse_unloadable_checks(raw_checks: Any) -> None:
    """A user check that cannot be imported refuses the run before its first request (#35): exit 2, one line
    naming the check and why, rather than an 'error' verdict on every record of a run that ends "completed"."""
    from ..quality.user_checks import loadable_error

    why = loadable_error(raw_checks)
    if why is not None:
        raise CliError(f"{why} (fix it, or remove it from [[checks.user]])")


def prepare_dedup(engine: Any, checks: Any) -> None:
    """--dedup-against: its index built (or found whole) before the run is loaded; a bad file is exit 2 (#38)."""
    from ..quality.checks import ChecksConfigError
    from ..quality.dedup_index import prepare

    try:
        print(prepare(str(engine.url), checks) or "", end="", file=sys.stderr)
    except ChecksConfigError as exc:
        raise CliError(str(exc)) from None


def _resume_settings(engine: Any, a: argparse.Namespace, run: dict[str, Any], config: Any) -> None:
    """A resume never changes settings silently: differences are refused, or become a new config version."""
    from ..quality.detection import overrides  # noqa: F401  - registers the guard a new config version passes (#35)
    from ..store.versions import create_version, refusal, resume_check

    stored = json.loads(run["config_json"])
    changes = resume_check(stored, config)
    fixed = [c for c in changes if c.path == "samples_per_prompt"]
    if fixed:  # its records were made when the run was loaded: a new version could not change them
        raise CliError(f"run {run['name']!r} was loaded with samples_per_prompt = {fixed[0].old or 1}; it cannot "
                       f"change on resume ({fixed[0].describe()}): start a new run (--name) for another k")
    if changes and not a.new_config_version:
        raise CliError(refusal(run["name"], changes))
    if changes:
        from ..store.queue import write_begin

        with engine.connect() as conn, write_begin(conn):
            snap = config.snapshot()
            # cap and concurrency are controls: the version keeps what the run was created with
            for key in ("cap", "concurrency"):
                snap[key] = stored.get(key, snap[key])
            version, _ = create_version(conn, run["id"], snap, actor="cli", reason=a.reason)
        print(f"run {run['name']!r}: config version {version} ("
              + "; ".join(c.describe() for c in changes) + ")", file=sys.stderr)
    # cap and concurrency: a flag sets them (a control, in the audit log); without one the run keeps its own
    flags = _flags_to_config(a)
    if "cap" not in flags:
        config.cap = run["cap"]
    if "concurrency" not in flags and run["concurrency"]:
        config.concurrency = run["concurrency"]


def _recheck_dashboard_changes(engine: Any, a: argparse.Namespace, run: dict[str, Any], config: Any,
                               toml: dict[str, Any] | None) -> None:
    """A resume acts only on what the operator's own configuration names or the dashboard may set (#34)."""
    from ..config import deep_merge

    flags = _flags_to_config(a)
    key_env = flags.pop("_api_key_env", None)
    flags.pop("_prices", None)
    operator = deep_merge(toml or {}, flags)
    if key_env:
        operator["endpoints"] = [{"api_key_env": key_env} for _ in config.endpoints]
    refuse_dashboard_changes(engine, run, config.snapshot(), operator, "this resume will not use them")


def refuse_dashboard_changes(engine: Any, run: dict[str, Any], config: dict[str, Any] | None = None,
                             operator: dict[str, Any] | None = None, what: str = "this command will not use them") -> None:
    """CliError when ``config`` (the run's, about to be acted on) holds a value a dashboard change stored that the
    settings policy refuses (a key variable, extra headers, a TLS file outside the dashboard's folders, an import
    path): nothing is sent, opened or imported, unless ``operator`` (these flags and --config) names it again.
    ``config`` None: the run's current configuration."""
    from ..settings import get_settings
    from ..settings_policy import recheck_versions
    from ..store.versions import current, history

    with engine.connect() as conn:
        versions = history(conn, run["id"])
        config = config if config is not None else current(conn, run["id"])[1]
        conn.rollback()
    problems = recheck_versions(versions, config, get_settings(), operator)
    if problems:
        raise CliError(
            f"run {run['name']!r}: a change made from the dashboard stored settings the dashboard may not set, and "
            f"{what}:\n" + "\n".join(f"  {k}: {why}" for k, why in problems)
            + "\nIf you mean them, name them in your own TOML file, given with --config to the run command (with "
            "--new-config-version), the checks command or the judge command; otherwise set them back the same way "
            "(docs/security.md, the settings policy).")


def handle(a: argparse.Namespace) -> int:
    from ..sources.load import matching_runs, stable_name
    from ..store.dashboards import run_link
    from ..store.db import DatabaseError, open_engine, safe_url
    from ..store.queue import NotFound, run_row
    from ..workers.endpoints import MissingApiKey
    from ..workers.engine import EXIT_CODES, RunWorker

    # Everything that can be wrong with the command is found before the database is opened (or created): the
    # TOML file, the settings, the dataset file, the key variables and the endpoint itself.
    toml = read_toml(a)
    fresh = None if a.join else resolve_config(a, None, toml, required=not a.name)
    if fresh is not None:
        check_before_writing(fresh, dataset=True, preflight=a.preflight)
    new_file = _new_sqlite_file(a.db)
    try:
        engine = open_engine(a.db)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None
    existing = None
    ref = a.join or a.name or (fresh.name if fresh is not None and fresh.name else None)
    if ref is None and fresh is not None:
        ref = stable_name(fresh)  # the same command again finds the same run
        with engine.connect() as conn:
            others = [n for n in matching_runs(conn, fresh) if n != ref]
            conn.rollback()
        if others and _find(engine, ref) is None:
            listed = ", ".join(repr(n) for n in others[-5:])
            raise CliError(f"this dataset, endpoint and model already have run(s) {listed}: resume run "
                           f"{others[-1]!r}? use --name {others[-1]} (or --name NEW to start another)")
    if ref:
        try:
            with engine.connect() as conn:
                existing = run_row(conn, ref)
        except NotFound as exc:
            if a.join:
                raise CliError(str(exc)) from None
    if existing is not None:
        if existing["kind"] != "generate":
            raise CliError(f"run {existing['name']!r} is a {existing['kind']} run (synthwatch {existing['kind']});"
                           " choose another --name")
        # resume (or join): the run's current config version, with what the flags and --config file change
        config = resolve_config(a, json.loads(existing["config_json"]), toml)
        config.name = existing["name"]
        _recheck_dashboard_changes(engine, a, existing, config, toml)
        refuse_unloadable_checks(config.checks)  # the run's stored checks, and those --config adds
        if fresh is None:
            check_before_writing(config, dataset=False, preflight=a.preflight)
        run_id, resumed = existing["id"], True
        prepare_dedup(engine, config.checks)
        from ..workers.judge import unkept_fields

        if (why := unkept_fields(engine, run_id, config.judge)) is not None:  # before any request or version (#38)
            raise CliError(why)
        _resume_settings(engine, a, existing, config)
    else:
        config = fresh if fresh is not None else resolve_config(a, None, toml)
        if fresh is None:
            check_before_writing(config, dataset=True, preflight=a.preflight)
        config.name = ref or stable_name(config)
        try:
            prepare_dedup(engine, config.checks)
            run_id, resumed = prepare_run(engine, config)
        except (RunLoadError, CliError) as exc:
            _forget_new_file(engine, new_file)  # a refused dataset leaves no database behind (#37)
            raise CliError(str(exc)) from None
    out = sys.stderr
    verb = "joining" if a.join else ("resuming" if resumed else "starting")
    print(f"{verb} run {config.name!r} (id {run_id}) in {safe_url(str(engine.url))}", file=out)
    link = run_link(engine, run_id, dashboard_hint(a.db))
    print(link, file=out)
    progress = Progress(config.name, json_lines=a.log_json, quiet=a.quiet, engine=engine, run_id=run_id,
                        resume_hint=hint("control", "resume", run=config.name, db=a.db),
                        ack_hint=hint("control", "resume", "--ack", "--for-records", ACK_RECORDS, run=config.name,
                                      db=a.db),
                        dashboard=link, exit_on_pause=a.exit_on_pause)
    from ..quality.checks import ChecksConfigError
    from ..quality.live import writer_hooks

    try:
        hooks = writer_hooks(engine, run_id, config)
    except ChecksConfigError as exc:
        raise CliError(str(exc)) from None
    try:
        # hard_exit: in the `synthwatch` program a stop that overruns its deadline ends the process (workers/supervisor.py)
        worker = RunWorker(engine, run_id, config, join=bool(a.join), hooks=hooks, on_tick=progress.tick,
                           hard_exit=a.program)
    except MissingApiKey as exc:
        raise CliError(str(exc)) from None

    if a.metrics_port is not None:
        from ..workers.worker_metrics import serve as serve_metrics

        try:
            port = serve_metrics(worker, a.metrics_port)
        except OSError as exc:
            raise CliError(f"--metrics-port {a.metrics_port}: cannot listen ({exc})") from None
        print(f"worker metrics: http://127.0.0.1:{port}/metrics", file=out)

    judge = _start_judge(engine, run_id, config, out)

    async def go() -> str:
        worker.install_signal_handlers()
        return await worker.main()

    try:
        final = asyncio.run(go())
    finally:
        if judge is not None:  # what the judge has left is judged for at most judge.drain_s (docs/checks.md)
            judge.finish(config.judge.drain_s)
            print(f"judge: {judge.runner.judged} verdicts written by this process"
                  + (f"; it stopped: {judge.error}" if judge.error else ""), file=out)
    # The run is over (its state is stored): a Ctrl-C from here on, the second of a double press landing as the
    # worker finished, has nothing left to stop and must not turn the outcome into an interrupt.
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        progress.close()
        with engine.connect() as conn:
            row = run_row(conn, run_id)
        message = (row.get("status_message") or "").replace("control RUN ", f"control {config.name} ")
        if progress.exited_paused and final == "stopped":
            final = "paused"
            message = _keep_paused(engine, run_id, row, config.name, a.db)
        head = final
        # the counts are said once: "completed: 3 ok, … — all prompts processed" (the stored message repeats them
        # for the pages, which do not print them beside it; #37)
        message = re.sub(r"^(all prompts processed): \d+ ok, \d+ errors, \d+ timeouts$", r"\1", message)
        if final == "completed" and message.startswith("completed with "):
            head, _, rest = message.partition(" (")
            message = rest.rstrip(")")
        print(
            f"run {config.name!r} {head}: {row['n_ok']} ok, {row['n_error']} errors, {row['n_timeout']} timeouts, "
            f"{row['n_pending']} pending" + (f" — {message}" if message else ""),
            file=out,
        )
        return EXIT_CODES.get(final, 1)
    finally:
        if main_thread and not a.program:  # the program keeps ignoring it until entry() takes over
            signal.signal(signal.SIGINT, previous)


def _new_sqlite_file(db: str | None) -> Path | None:
    """The SQLite file this command is about to create (None: it exists already, or the database is a server)."""
    from ..store.db import DatabaseError, resolve_url
    from ..store.fresh import sqlite_path

    try:
        path = sqlite_path(resolve_url(db))
    except DatabaseError:
        return None
    return Path(path) if path is not None and not Path(path).exists() else None


def _forget_new_file(engine: Any, path: Path | None) -> None:
    """Remove the database this command created, when nothing was written to it but the schema."""
    engine.dispose()
    if path is None:
        return
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def _start_judge(engine: Any, run_id: int, config: Any, out: Any) -> Any:
    """The run's judge model in a thread of its own (synthwatch.workers.judge), or None without [judge]."""
    if config.judge is None:
        return None
    from ..workers.endpoints import MissingApiKey
    from ..workers.judge import start_in_thread

    try:
        judge = start_in_thread(engine, run_id, config.judge, config.name or "")
    except MissingApiKey as exc:
        raise CliError(f"judge: {exc} (api_key_env under [judge.endpoint])") from None
    print(f"judge: {config.judge.model} at {config.judge.endpoint.label}, {config.judge.sample_fraction:.0%} of the "
          f"ok records, {config.judge.concurrency} in flight", file=out)
    return judge


def _find(engine: Any, name: str) -> int | None:
    from ..store.queue import find_run_id

    with engine.connect() as conn:
        found = find_run_id(conn, name)
        conn.rollback()
    return found


def _keep_paused(engine: Any, run_id: int, row: dict[str, Any], name: str, db: str | None) -> str:
    """--exit-on-pause: this worker left a paused run; the run stays paused (its status said "stopped" when this
    was its last worker), so that `synthwatch control RUN resume` and the dashboard's resume still apply."""
    from ..store.queue import pause_reason, set_status, write_begin

    with engine.connect() as conn:
        reason, _rules = pause_reason(conn, run_id)
    if reason:  # an alarm holds the run: a plain resume would be refused
        why = reason.split(". Acknowledge and resume")[0]
        message = (f"{why}; the worker exited (--exit-on-pause): fix the cause, or acknowledge and resume with "
                   f"`{hint('control', 'resume', '--ack', '--for-records', ACK_RECORDS, run=name, db=db)}`, then run "
                   f"again (`{hint('run', '--name', name, db=db)}`)")
    else:
        message = (f"paused; the worker exited (--exit-on-pause): resume with `{hint('control', 'resume', run=name, db=db)}`"
                   f", then run again (`{hint('run', '--name', name, db=db)}`)")
    if row.get("status") == "stopped":
        with engine.connect() as conn, write_begin(conn):
            set_status(conn, run_id, "paused", message)
    return message
