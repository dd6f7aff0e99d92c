"""Preflight: is each endpoint there, does it take our key, and does it serve the model? Checked before a run is
created or its dataset loaded, so that a wrong URL, a missing ``/v1``, a refused key or a wrong model name is
one clear line at once, not a run full of errors minutes later (`synthwatch run`, `synthwatch probe`).

It asks ``GET {base_url}/models`` (every OpenAI-compatible server answers it, vLLM and SGLang included) and
reads the served models. The server's own words are quoted (clipped, escaped: a reply is untrusted), and each
problem says its fix as both the flag and the TOML key."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
from dataclasses import dataclass
from typing import Any

import orjson

from ..redact import clip, redact

MAX_QUOTED_CHARS = 200  # of a server's reply, in an error line
MAX_LISTED_MODELS = 10
MAX_MODELS_BYTES = 8 * 2**20  # of a /models reply read (a list of models is a few kB; a reply is untrusted)


class PreflightError(Exception):
    """An endpoint that a run cannot use; ``str()`` is one line for a terminal (what, the server's words, the fix)."""


@dataclass
class EndpointFacts:
    base_url: str
    models: list[str]


def _quote(text: str) -> str:
    # redacted before the cut (a server may echo the key back, and a cut key is still a key), then clipped
    return repr(clip(" ".join(text.split()), MAX_QUOTED_CHARS, " …"))


def check_endpoint(base_url: str, model: str, *, headers: dict[str, str] | None = None,
                   verify: ssl.SSLContext | bool = True, timeout_s: float = 10.0, proxy: str | None = None,
                   proxy_headers: dict[str, str] | None = None, key_env: str | None = None) -> EndpointFacts:
    """Raise PreflightError unless ``base_url`` answers ``/models`` and lists ``model``. ``key_env``: the variable
    the key in ``headers`` came from, named when the server refuses it.

    Asked through aiohttp, as the run's own requests are (the worker imports it anyway; httpx cost the run
    ~0.1 CPU-s to import, #25): the same header values, TLS settings and proxy, no redirect followed, no
    ~/.netrc read (``trust_env`` off)."""
    return _run_to_end(_check_endpoint(base_url, model, headers or {}, verify, timeout_s, proxy, proxy_headers,
                                       key_env))


def _run_to_end(coro: Any) -> Any:
    """asyncio.run, also from a thread whose event loop is already running (a caller inside a loop, or a host
    such as Playwright's sync API): there the check runs on a thread of its own with a loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="preflight") as pool:
        return pool.submit(asyncio.run, coro).result()


async def _get(session: Any, url: str, proxy: str | None, proxy_headers: dict[str, str] | None) -> tuple[int, str]:
    async with session.get(url, allow_redirects=False, proxy=proxy, proxy_headers=proxy_headers) as r:
        # a reply is untrusted: no more than MAX_MODELS_BYTES of it is read (a list of models is a few kB)
        raw = await r.content.read(MAX_MODELS_BYTES + 1)
        if len(raw) > MAX_MODELS_BYTES:
            raw = raw[:MAX_MODELS_BYTES]
            r.close()  # the rest is not read: the connection is not reused
        return r.status, raw.decode("utf-8", "replace")


async def _check_endpoint(base_url: str, model: str, headers: dict[str, str], verify: ssl.SSLContext | bool,
                          timeout_s: float, proxy: str | None, proxy_headers: dict[str, str] | None,
                          key_env: str | None = None) -> EndpointFacts:
    import aiohttp

    base = base_url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout, headers=headers, connector=aiohttp.TCPConnector(ssl=verify),
                                         trust_env=False) as client:
            try:
                status, body = await _get(client, f"{base}/models", proxy, proxy_headers)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                what = f"{type(exc).__name__}: {redact(str(exc)) or 'no answer'}" if not isinstance(exc, TimeoutError) \
                    else f"no answer within {timeout_s:g} s"
                raise PreflightError(
                    f"cannot reach {base} ({what}): is the server running and is --base-url (base_url) right?"
                ) from None
            if status == 404 and not base.endswith("/v1"):
                try:
                    alt, _ = await _get(client, f"{base}/v1/models", proxy, proxy_headers)
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                    alt = None
                if alt == 200:
                    raise PreflightError(
                        f"GET {base}/models answered 404 {_quote(body)}, but {base}/v1/models answers: the base "
                        f"URL misses /v1; use --base-url {base}/v1 (base_url = \"{base}/v1\")")
            if status in (401, 403):
                sent = any(k.lower() == "authorization" for k in headers)
                if sent:  # a key was given and refused: the advice to give one was wrong (#37)
                    where = f"the key in ${key_env}" if key_env else "the API key given"
                    raise PreflightError(
                        f"GET {base}/models answered {status} {_quote(body)}: the server refused {where}; check "
                        f"that {'the variable' if key_env else 'it'} holds a key this server accepts")
                raise PreflightError(
                    f"GET {base}/models answered {status} {_quote(body)}: the server wants an API key "
                    f"it accepts; put it in an environment variable and name it with --api-key-env NAME "
                    f"(api_key_env = \"NAME\" under [[endpoints]])")
            if status != 200:
                hint = (" (an OpenAI-compatible base URL usually ends with /v1)" if not base.endswith("/v1")
                        else "")
                raise PreflightError(
                    f"GET {base}/models answered {status} {_quote(body)}: not an OpenAI-compatible "
                    f"endpoint at this address{hint}; check --base-url (base_url)")
            try:
                data: Any = orjson.loads(body)
                models = [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)]
            except (ValueError, AttributeError, TypeError):
                raise PreflightError(
                    f"GET {base}/models answered 200 but not the OpenAI list of models ({_quote(body)}); "
                    f"check --base-url (base_url)") from None
    except ssl.SSLError as exc:
        raise PreflightError(f"cannot reach {base}: TLS: {redact(str(exc))}") from None
    if model not in models:
        listed = ", ".join(models[:MAX_LISTED_MODELS]) + (" …" if len(models) > MAX_LISTED_MODELS else "")
        first = models[0] if models else "NAME"
        raise PreflightError(
            f"{base} does not serve model {model!r}; it serves: {listed or '(none listed)'}; use --model {first} "
            f"(model = \"{first}\")")
    return EndpointFacts(base, models)


def check_run_endpoints(config: Any, timeout_s: float = 10.0) -> None:
    """Every endpoint of a run config: its key variables (an unset one is a MissingApiKey from the pool, naming
    the variable) and then check_endpoint with the headers and TLS settings the run itself will use."""
    from .endpoints import EndpointPool

    pool = EndpointPool(config.endpoints, config.pool)
    for ep in pool.endpoints:
        auth = {k: v for k, v in ep.headers.items() if k.lower() not in ("content-type", "accept")}
        key_env = next((e.api_key_env or e.headers_env.get("Authorization") or e.headers_env.get("authorization")
                        for e in config.endpoints if e.base_url.rstrip("/") == ep.base_url.rstrip("/")), None)
        check_endpoint(ep.base_url, config.model, headers=auth, verify=ep.ssl, timeout_s=timeout_s, proxy=ep.proxy,
                       proxy_headers=ep.proxy_headers, key_env=key_env)
