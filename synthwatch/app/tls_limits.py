"""Which TLS files a run's endpoints may name when they come from the dashboard (the start form, a run's settings
form, ``POST /api/runs`` and ``POST /api/runs/{id}/settings``).

A worker reads an endpoint's ``tls.ca_bundle``, ``tls.client_cert`` and ``tls.client_key`` when it starts, with the
dashboard's permissions when the dashboard started it. Like datasets and tokenizers, a path given there must lie
inside a folder the dashboard's settings allow (SYNTHWATCH_LAUNCH_TLS_DIRS), every symlink and ``..`` resolved
first, and nothing is said about a path outside them (no existence oracle). A path the run already has (set with
``synthwatch run`` or its config file, which may name any file) is kept as it is; the CLI's own flags are not
limited.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..settings import Settings
from .folders import LaunchError, allowed_dirs

TLS_FILES = ("ca_bundle", "client_cert", "client_key")


def tls_dirs(settings: Settings, base_dir: Path | None = None) -> list[Path]:
    return allowed_dirs(settings.launch_tls_dirs, base_dir)


def check_tls_file(path: str, what: str, settings: Settings, base_dir: Path | None = None) -> str:
    """``path`` resolved, if it is a file inside a folder the settings allow; LaunchError otherwise."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = (base_dir or Path.cwd()) / p
    real = p.resolve()
    dirs = tls_dirs(settings, base_dir)
    if not any(real == d or real.is_relative_to(d) for d in dirs):
        shown = ":".join(str(d) for d in dirs) or "(none)"
        raise LaunchError(f"{what}: {path!r} is outside the folders the dashboard may read TLS files from ({shown}; "
                          "the SYNTHWATCH_LAUNCH_TLS_DIRS setting). Put the file there, or set it with `synthwatch "
                          "run` or the run's config file")
    if not real.is_file():
        raise LaunchError(f"{what}: {path!r}: no such file")
    return str(real)


def _kept(endpoints: Any) -> set[str]:
    """The TLS paths a run's configuration already holds (set from the command line: not re-checked)."""
    out: set[str] = set()
    for ep in endpoints if isinstance(endpoints, list) else []:
        tls = ep.get("tls") if isinstance(ep, dict) else None
        if isinstance(tls, dict):
            out |= {v for k, v in tls.items() if k in TLS_FILES and isinstance(v, str)}
    return out


def limit_tls(endpoints: Any, settings: Settings, current: Any = None, base_dir: Path | None = None) -> Any:
    """``endpoints`` (a config's list of endpoint tables) with each new TLS path checked and resolved; the paths
    of ``current`` (the run's endpoints before this change) are kept as they are. LaunchError on the first bad one."""
    if not isinstance(endpoints, list):
        return endpoints
    kept = _kept(current)
    out = []
    for i, ep in enumerate(endpoints):
        tls = ep.get("tls") if isinstance(ep, dict) else None
        if isinstance(tls, dict):
            tls = dict(tls)
            for key in TLS_FILES:
                value = tls.get(key)
                if value is None or (isinstance(value, str) and value in kept):
                    continue
                if not isinstance(value, str) or not value.strip():
                    raise LaunchError(f"endpoints[{i}].tls.{key}: a file path")
                tls[key] = check_tls_file(value.strip(), f"endpoints[{i}].tls.{key}", settings, base_dir)
            ep = {**ep, "tls": tls}
        out.append(ep)
    return out
