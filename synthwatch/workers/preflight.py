"""Preflight: is each endpoint there, does it take our key, and does it serve the model? Checked before a run is
created or its dataset loaded, so that a wrong URL, a missing ``/v1``, a refused key or a wrong model name is
one clear line at once, not a run full of errors minutes later (`synthwatch run`, `synthwatch probe`).

It asks ``GET {base_url}/models`` (every OpenAI-compatible server answers it, vLLM and SGLang included) and
reads the served models. The server's own words are quoted (clipped, escaped: a reply is untrusted), and each
problem says its fix as both the flag and the TOML key."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import orjson

from ..outbound import OutboundError, Reply, fetch, register, run_sync, session
from ..redact import clip, redact

MAX_QUOTED_CHARS = 200  # of a server's reply, in an error line
MAX_LISTED_MODELS = 10
MAX_MODELS_BYTES = 8 * 2**20  # of a /models reply read (a list of models is a few kB; a reply is untrusted)


class PreflightError(Exception):
    """An endpoint that a run cannot use; ``str()`` is one line for a terminal (what, the server's words, the fix),
    redacted: a server's model list may echo the key back as a model's name."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


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

    Asked through the outbound client (synthwatch/outbound.py), as the run's own requests are: the same header
    values, TLS settings and proxy, no redirect followed, no ~/.netrc read, ``timeout_s`` for each request in all
    (connect, headers and body), at most MAX_MODELS_BYTES of a reply read (decoded)."""
    return run_sync(_check_endpoint(base_url, model, headers or {}, verify, timeout_s, proxy, proxy_headers,
                                    key_env))


async def _check_endpoint(base_url: str, model: str, headers: dict[str, str], verify: ssl.SSLContext | bool,
                          timeout_s: float, proxy: str | None, proxy_headers: dict[str, str] | None,
                          key_env: str | None = None) -> EndpointFacts:
    base = base_url.rstrip("/")
    async with session("preflight", headers=headers, ssl=verify) as client:

        async def get(url: str) -> Reply:
            return await fetch(client, "GET", url, cap=MAX_MODELS_BYTES, deadline_s=timeout_s, proxy=proxy,
                               proxy_headers=proxy_headers)

        try:
            r = await get(f"{base}/models")
        except OutboundError as exc:
            if exc.kind == "too_large":
                raise PreflightError(f"GET {base}/models answered 200 but not the OpenAI list of models (more than "
                                     f"{MAX_MODELS_BYTES:,} bytes); check --base-url (base_url)") from None
            what = f"no answer within {timeout_s:g} s" if exc.kind == "timeout" else exc.message or "no answer"
            raise PreflightError(
                f"cannot reach {base} ({what}): is the server running and is --base-url (base_url) right?"
            ) from None
        status, body = r.status, r.head(MAX_QUOTED_CHARS)  # what an error line quotes: a bounded prefix
        if status == 404 and not base.endswith("/v1"):
            try:
                alt: int | None = (await get(f"{base}/v1/models")).status
            except OutboundError:
                alt = None
            if alt == 200:
                raise PreflightError(
                    f"GET {base}/models answered 404 {_quote(body)}, but {base}/v1/models answers: the base "
                    f"URL misses /v1; use --base-url {base}/v1 (base_url = \"{base}/v1\")")
    if status in (401, 403):
        if any(k.lower() == "authorization" for k in headers):  # a key was given and refused: not "give one" (#37)
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
        data: Any = orjson.loads(r.body)
        models = [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError, TypeError):
        raise PreflightError(
            f"GET {base}/models answered 200 but not the OpenAI list of models ({_quote(body)}); "
            f"check --base-url (base_url)") from None
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


@register("preflight", "the run's preflight: GET /models before a run is created (workers/preflight.py)", 6.0)
def _drive_preflight(base_url: str, key_env: str) -> str:
    from ..redact import secret_from_env

    key = secret_from_env(key_env)
    try:
        facts = check_endpoint(base_url, "m", headers={"Authorization": f"Bearer {key}"}, timeout_s=5.0)
    except PreflightError as exc:
        return str(exc)
    return f"serves {facts.models}"
