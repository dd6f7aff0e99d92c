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

from ..redact import clip, redact

MAX_QUOTED_CHARS = 200  # of a server's reply, in an error line
MAX_LISTED_MODELS = 10


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
                   verify: ssl.SSLContext | bool = True, timeout_s: float = 10.0) -> EndpointFacts:
    """Raise PreflightError unless ``base_url`` answers ``/models`` and lists ``model``."""
    import httpx

    base = base_url.rstrip("/")
    try:
        # header values as UTF-8 bytes, exactly as the worker's own requests send them (a key may hold non-ASCII
        # characters that redact.secret_problem allows): the server sees the same key from both
        raw = {k.encode("ascii"): v.encode("utf-8") for k, v in (headers or {}).items()}
        with httpx.Client(timeout=timeout_s, headers=raw, verify=verify) as client:
            try:
                r = client.get(f"{base}/models")
            except httpx.HTTPError as exc:
                raise PreflightError(
                    f"cannot reach {base} ({type(exc).__name__}: {redact(str(exc)) or 'no answer'}): is the server running "
                    f"and is --base-url (base_url) right?") from None
            if r.status_code == 404 and not base.endswith("/v1"):
                try:
                    alt = client.get(f"{base}/v1/models")
                except httpx.HTTPError:
                    alt = None
                if alt is not None and alt.status_code == 200:
                    raise PreflightError(
                        f"GET {base}/models answered 404 {_quote(r.text)}, but {base}/v1/models answers: the base "
                        f"URL misses /v1; use --base-url {base}/v1 (base_url = \"{base}/v1\")")
            if r.status_code in (401, 403):
                raise PreflightError(
                    f"GET {base}/models answered {r.status_code} {_quote(r.text)}: the server wants an API key "
                    f"it accepts; put it in an environment variable and name it with --api-key-env NAME "
                    f"(api_key_env = \"NAME\" under [[endpoints]])")
            if r.status_code != 200:
                hint = (" (an OpenAI-compatible base URL usually ends with /v1)" if not base.endswith("/v1")
                        else "")
                raise PreflightError(
                    f"GET {base}/models answered {r.status_code} {_quote(r.text)}: not an OpenAI-compatible "
                    f"endpoint at this address{hint}; check --base-url (base_url)")
            try:
                data: Any = r.json()
                models = [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)]
            except (ValueError, AttributeError, TypeError):
                raise PreflightError(
                    f"GET {base}/models answered 200 but not the OpenAI list of models ({_quote(r.text)}); "
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
        check_endpoint(ep.base_url, config.model, headers=auth, verify=ep.ssl, timeout_s=timeout_s)
