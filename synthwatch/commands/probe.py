"""`synthwatch probe --base-url URL --model M`: preflight an endpoint before a long run."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys

import orjson

from ..cli import CliError
from ..hints import command as hint
from ..probe import PROBE_MAX_TOKENS, PROBE_OWN_KEYS
from ._common import json_object_flag, positive_float, positive_int


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "probe",
        help="send a few requests to an endpoint and say how to configure a run and its export",
        description="Sends a non-streamed request (asking for token ids), the same request streamed and a request "
        "offering one tool, then reports the server's kind and version, where the reasoning arrives, whether "
        "token ids come back and the prompt is prefilled with <think>, whether tool calls parse and, with "
        "--tokenizer, what its chat template does to the answer. Ends with a one-line verdict and the settings "
        "to use. Exit code 0 when ready, 1 when not. See docs/configuration.md.",
    )
    p.add_argument("--base-url", required=True, help="the endpoint's OpenAI base URL, e.g. http://host:8000/v1")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the API key")
    p.add_argument("--tokenizer", help="tokenizer folder, cached name or 'deepseek-v4' (checks the template)")
    p.add_argument("--chat-template", help="chat template file (.jinja) or 'deepseek-v4'")
    p.add_argument("--trust-remote-code", action="store_true", help='let the tokenizer run its own code')
    p.add_argument("--max-tokens", type=positive_int, default=PROBE_MAX_TOKENS,
                   help=f"max_tokens of each probe request (default {PROBE_MAX_TOKENS}: a reasoning model thinks "
                   "first; at 512 it was cut before any content)")
    p.add_argument("--extra-body", metavar="JSON", help="JSON object merged into every probe request, as the run's "
                   "--extra-body (sampling.extra_body), e.g. '{\"chat_template_kwargs\": {\"thinking\": true}}'")
    p.add_argument("--timeout", type=positive_float, default=60.0, metavar="S",
                   help="each request's deadline, from connecting to the end of its reply (default 60)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..probe import ProbeError, ProbeOptions, probe
    from ..redact import SecretError, secret_from_env

    with contextlib.suppress(AttributeError, ValueError):  # a terminal that cannot show a character gets an escape
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    key = None
    if args.api_key_env:
        try:  # the same rule as `synthwatch run`: a key HTTP cannot carry, or too short to redact, is refused
            key = secret_from_env(args.api_key_env)
        except SecretError as exc:
            raise CliError(str(exc)) from None
    extra = None
    if args.extra_body is not None:
        extra = json_object_flag(args.extra_body, "--extra-body")
        own = [k for k in PROBE_OWN_KEYS if k in extra]
        if own:
            raise CliError(f"--extra-body may not set {', '.join(own)}: the probe sends its own question, "
                           "non-streamed and streamed")
    options = ProbeOptions(base_url=args.base_url, model=args.model, api_key=key, max_tokens=args.max_tokens,
                           timeout_s=args.timeout, tokenizer=args.tokenizer, chat_template=args.chat_template,
                           trust_remote_code=args.trust_remote_code, extra_body=extra)
    from ..workers.preflight import PreflightError, check_endpoint

    # the endpoint itself first, as `synthwatch run` checks it: a missing /v1, a refused key or a model the server
    # does not serve is named with the server's words and the fix (a bare "answered 404" was all it said)
    try:
        check_endpoint(args.base_url, args.model, headers={"authorization": f"Bearer {key}"} if key else None,
                       timeout_s=args.timeout, key_env=args.api_key_env)
    except PreflightError as exc:
        raise CliError(str(exc)) from None
    try:
        report = probe(options)
    except ProbeError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        sys.stdout.write(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0 if report.ready else 1
    s, r, ids, tools = report.server, report.reasoning, report.token_ids, report.tool_calls
    print(f"server:     {s.get('kind') or 'unknown'} {s.get('version') or ''} ({s.get('evidence') or 'no evidence'}); "
          f"model listed: {'yes' if s.get('model_listed') else 'no'}")
    print(f"reasoning:  non-streamed in {r['non_streamed']!r}, streamed in {r['streamed']!r}; "
          f"{r['reasoning_chars']} reasoning / {r['content_chars']} content characters, finish {r['finish_reason']}")
    line = f"token ids:  {'returned' if ids['returned'] else 'not returned'}"
    if ids["returned"]:
        line += f"; prompt ends {ids['prompt_tail']}"
        if "prompt_tail_text" in ids:
            line += f" ({ids['prompt_tail_text']!r})"
        if "prompt_prefilled_think" in ids:
            line += (f": prefilled <think> {'yes' if ids['prompt_prefilled_think'] else 'no'} "
                     f"({ids['prefill_evidence']})")
        if "completion_ends_with_eos" in ids:
            line += (f"; completion ends with EOS {'yes' if ids['completion_ends_with_eos'] else 'no'} "
                     f"(finish {ids['finish_reason']})")
    print(line)
    print(f"tool calls: {tools.get('detail')}")
    if report.n_choices:
        print(f"n choices:  {report.n_choices.get('detail')}")
    tok = report.tokenizer
    if tok is not None:
        if tok.get("problem"):
            print(f"template:   {tok['template']}: {tok['problem']} ({tok.get('detail', '')})")
        else:
            print(f"template:   {tok['template']}: reasoning survives: {'yes' if tok['reasoning_survives'] else 'NO'}; "
                  f"trained span {tok['trained_span']!r}")
        if "prompt_matches_server" in tok:
            print(f"            its prompt ids match the server's: {'yes' if tok['prompt_matches_server'] else 'NO'}")
    for problem in report.problems:
        print(f"problem:    {problem}")
    for warning in report.warnings:
        print(f"warning:    {warning}")
    flags, notes = recommended(report.settings)
    print("settings:   " + (", ".join(f"{flag} ({toml})" for flag, toml in flags) or "the defaults"))
    for note in notes:
        print(f"            {note}")
    words = ["run", "--base-url", args.base_url, "--model", args.model]
    words += [w for flag, _ in flags if flag.startswith("--") for w in shlex.split(flag)]
    if args.api_key_env:
        words += ["--api-key-env", args.api_key_env]
    if args.extra_body is not None:
        words += ["--extra-body", args.extra_body]
    # the dataset is the one word left to the person: FILE (every other value is the probe's own)
    print(f"run with:   {hint(*words, with_db=False)} --dataset FILE")
    print(report.verdict)
    return 0 if report.ready else 1


# the probe's settings (TOML keys, probe.py) as `synthwatch run` flags: every recommendation names both
_FLAGS = {
    "reasoning.mode": ("--reasoning-mode {v}", "[reasoning] mode = \"{v}\""),
    "reasoning.prefilled_open": ("--reasoning-prefilled-open", "[reasoning] prefilled_open = true"),
    "tokenizer.name_or_path": ("--tokenizer {v}", "[tokenizer] name_or_path = \"{v}\""),
    "tokenizer.chat_template": ("--chat-template {v}", "[tokenizer] chat_template = \"{v}\""),
}


def recommended(settings: dict[str, object]) -> tuple[list[tuple[str, str]], list[str]]:
    """(flag, TOML) pairs for `synthwatch run`, and the notes that are not run settings (export, trainers)."""
    flags: list[tuple[str, str]] = []
    notes: list[str] = []
    for key, value in settings.items():
        if key == "request_token_ids":
            flags.append(("--request-token-ids", "request_token_ids = true") if value
                          else ("no --request-token-ids", "request_token_ids = false"))
        elif key == "samples_in_one_request":  # only with --samples-per-prompt K: a note, not a flag of the line
            notes.append("with --samples-per-prompt K: --samples-in-one-request (samples_in_one_request = true)" if value
                         else "samples_in_one_request = false (the server does not answer n choices)")
        elif key in _FLAGS and value not in (None, False):
            flag, toml = _FLAGS[key]
            flags.append((flag.format(v=value), toml.format(v=value)))
        else:
            notes.append(f"{key}: {value}")
    return flags, notes
