"""The start form's "Probe the endpoint" button, run off the request threads (#34).

The probe runs as a task on the dashboard's event loop, its requests through the outbound client
(synthwatch/outbound.py): it holds no thread while it waits for a server, so probes of a server that trickles its
reply cannot starve the pages and the API (pause and stop included) of the thread pool. It ends within
:data:`DEADLINE_S` whatever the server does (each request's deadline, and the whole probe's), reads no more than
``probe.MAX_REPLY_BYTES`` of a reply after decompression, and is cancelled when the browser goes away. At most
:data:`MAX_RUNNING` probes run at once; one more is answered 429 with a line saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..outbound import register, run_sync
from ..probe import ProbeError, ProbeOptions, ProbeReport, probe_async

DEADLINE_S = 30.0
"""The longest a probe from the dashboard takes, whatever the server does."""
REQUEST_DEADLINE_S = 15.0
"""Each of its requests' (the probe sends up to six)."""
MAX_RUNNING = 4
"""Probes from the dashboard running at once (per dashboard process)."""
DISCONNECT_POLL_S = 0.25


class Busy(Exception):
    """MAX_RUNNING probes are running already."""


class Gone(Exception):
    """The client went away: the probe was cancelled."""


class ProbeSlots:
    """How many dashboard probes run now (one per app, on its loop: no lock needed)."""

    def __init__(self, limit: int = MAX_RUNNING) -> None:
        self.limit = limit
        self.running = 0


def slots_of(state: Any) -> ProbeSlots:
    slots = getattr(state, "probe_slots", None)
    if slots is None:
        slots = state.probe_slots = ProbeSlots()
    return slots


def options_for(base_url: str, model: str, api_key: str | None) -> ProbeOptions:
    return ProbeOptions(base_url, model, api_key=api_key, timeout_s=REQUEST_DEADLINE_S, deadline_s=DEADLINE_S)


async def client_gone(receive: Callable[[], Awaitable[Any]]) -> None:
    """Returns when the ASGI ``receive`` of a request whose body was read says the client disconnected.

    (Starlette's ``request.is_disconnected()`` polls with a receive cancelled at once, which never sees the
    disconnect through the dashboard's http middleware: its receive runs in a task group that the cancel ends
    first. Waiting for the next message does see it.)"""
    while (await receive()).get("type") != "http.disconnect":
        await asyncio.sleep(DISCONNECT_POLL_S)


async def run_probe(slots: ProbeSlots, options: ProbeOptions,
                    gone: Callable[[], Coroutine[Any, Any, Any]]) -> ProbeReport:
    """The probe as a task of this loop; Busy when ``slots`` are full, Gone (the task cancelled) as soon as
    ``gone()`` returns (the client left), ProbeError (redacted) when the endpoint cannot be probed."""
    if slots.running >= slots.limit:
        raise Busy(f"{slots.running} probes are running already (at most {slots.limit} at once); try again when "
                   f"one has ended (each ends within {DEADLINE_S:g} s)")
    slots.running += 1
    task = asyncio.create_task(probe_async(options))

    watcher = asyncio.create_task(gone())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()  # its requests are cancelled with it: their connections close at once
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        slots.running -= 1
    if task.cancelled():
        raise Gone("the client went away: the probe was cancelled")
    return task.result()


async def _never() -> None:
    await asyncio.Event().wait()


@register("probe_button", "the dashboard's probe button (app/probe_button.py), on the dashboard's loop", 32.0)
def _drive_button(base_url: str, key_env: str) -> str:
    from ..redact import secret_from_env

    async def go() -> str:
        opts = options_for(base_url, "m", secret_from_env(key_env))
        opts.max_tokens, opts.timeout_s = 8, 2.0
        try:
            report = await run_probe(ProbeSlots(), opts, _never)
        except (ProbeError, Busy, Gone) as exc:
            return str(exc)
        return str(report.as_dict())

    return run_sync(go())
