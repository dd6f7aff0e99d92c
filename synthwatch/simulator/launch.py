"""Running the simulator: its command-line flags, a blocking run, and one in a background thread."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future

from .config import REASONING_FIELDS, TOKEN_ID_MODES, SimConfig
from .server import Simulator
from .server_view import SERVER_KINDS

# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one ``--flag`` per :class:`SimConfig` field (underscores become dashes)."""
    defaults = SimConfig()
    helps = {
        "model": "model name served",
        "fingerprint": "system_fingerprint sent in responses",
        "max_model_len": "context length reported by /v1/models",
        "reasoning_field": "where reasoning goes: " + ", ".join(REASONING_FIELDS),
        "tokens_per_s": "decode speed per stream (0 = as fast as possible)",
        "ttft_ms": "delay before the first token",
        "reasoning_tokens": "reasoning length: N, LO-HI or lognormal:MU:SIGMA",
        "content_tokens": "answer length: N, LO-HI or lognormal:MU:SIGMA",
        "retry_after_s": "Retry-After on injected 429s",
        "stall_s": "length of an injected stall in seconds",
        "seed": "seed for text and fault draws",
        "token_ids": "token ids for return_token_ids: " + ", ".join(TOKEN_ID_MODES),
        "capacity": "requests generating at once before the rest queue (0 = unlimited): the knee",
        "server_kind": "what /metrics and /version look like: " + ", ".join(SERVER_KINDS),
        "rate_preempt": "with a capacity: share of streams preempted once while requests queue",
        "batch_slowdown": "B: each paced stream decodes at tokens_per_s / (1 + running / B) (0 = no slowdown)",
        "kv_max_concurrency": "requests that fit at once, as /metrics' cache_config_info publishes it (0 = capacity)",
        "server_version": "the version /version (or SGLang's /get_server_info) reports",
        "keep_requests": "keep the messages of the last N chat requests, served by GET /sim/requests",
        "unclosed_reasoning": "share of prompts whose model stops inside its reasoning (no </think>, no answer)",
        "rate_wrong_answer": "share of requests (0..1) whose arithmetic answer is one too high (drawn per request)",
        "boxed_answers": "give the arithmetic result as $\\boxed{N}$ (what math verifiers read) instead of **N**",
        "judge": "answer as a judge: a JSON verdict {score, label, reason} on the answer in the prompt",
        "refuse_response_format": "answer 400 to a request with response_format (no guided decoding)",
        "ignore_n": "ignore a request's n and answer one choice (a server without n support)",
    }
    group = parser.add_argument_group("simulator")
    for f in dataclasses.fields(SimConfig):
        default = getattr(defaults, f.name)
        kind = type(default)
        flag = "--" + f.name.replace("_", "-")
        if f.name.startswith("rate_") and f.name not in helps:
            text = f"share of requests (0..1) with the {f.name[5:]} fault"
        else:
            text = helps.get(f.name, f.name)
        choices = (
            REASONING_FIELDS
            if f.name == "reasoning_field"
            else TOKEN_ID_MODES
            if f.name == "token_ids"
            else SERVER_KINDS
            if f.name == "server_kind"
            else None
        )
        if kind is bool:  # a switch: `--judge`, not `--judge VALUE` (bool("False") is True)
            group.add_argument(flag, dest="sim_" + f.name, action="store_true", default=default,
                               help=f"{text} (default: off)")
            continue
        group.add_argument(
            flag,
            dest="sim_" + f.name,
            type=kind,
            default=default,
            choices=choices,
            help=f"{text} (default: {default})",
        )


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """Build a :class:`SimConfig` from flags added by :func:`add_arguments`."""
    values = {
        f.name: getattr(ns, "sim_" + f.name)
        for f in dataclasses.fields(SimConfig)
        if hasattr(ns, "sim_" + f.name)
    }
    return SimConfig(**values)


def run(config: SimConfig, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM (for ``synthwatch simulate``)."""

    async def main() -> None:
        sim = Simulator(config)
        bound = await sim.start(host, port)
        shown = f"[{host}]" if ":" in host else host
        print(f"simulator listening on http://{shown}:{bound}/v1", flush=True)  # noqa: T201
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, done.set)
        try:
            await done.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await sim.stop()

    asyncio.run(main())


@contextlib.contextmanager
def running_in_thread(config: SimConfig, host: str = "127.0.0.1") -> Iterator[str]:
    """Run a simulator on its own event loop in a thread; yields ``http://HOST:PORT/v1``."""
    loop = asyncio.new_event_loop()
    sim = Simulator(config)
    ready: Future[int] = Future()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            try:
                ready.set_result(loop.run_until_complete(sim.start(host, 0)))
            except BaseException as exc:
                ready.set_exception(exc)
                return
            loop.run_forever()
            loop.run_until_complete(sim.stop())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    thread = threading.Thread(target=serve, name="synthwatch-simulator", daemon=True)
    thread.start()
    port = ready.result(timeout=120)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
