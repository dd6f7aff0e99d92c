"""TLS files named from the dashboard obey folder limits like datasets and tokenizers (#25 item 6).

The reproduction from the issue: ``POST /api/runs/{id}/settings`` accepted ``tls.ca_bundle: /etc/passwd``, a file
the worker then reads with the dashboard's permissions. Now a TLS path given there must lie inside
SYNTHWATCH_LAUNCH_TLS_DIRS (symlinks and ``..`` resolved first); the paths a run already has (from the command
line) are kept; and `synthwatch run` itself may name any file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
from conftest import write_prompts
from workerkit import create, make_config, run_row

SAME = {"Sec-Fetch-Site": "same-origin"}


def test_tls_paths_from_the_api_stay_inside_the_allowed_folders(tmp_path: Path, engine: Any, live_app: Any) -> None:
    allowed, other = tmp_path / "tls", tmp_path / "other"
    allowed.mkdir()
    other.mkdir()
    for f in (allowed / "ca.pem", allowed / "client.pem", other / "ca.pem", other / "cli-ca.pem"):
        f.write_text("-----BEGIN CERTIFICATE-----\n")
    (allowed / "link.pem").symlink_to(other / "ca.pem")
    (allowed / "sub").symlink_to(other, target_is_directory=True)
    cli_ca = str(other / "cli-ca.pem")  # set with `synthwatch run`: not limited, and kept by later changes
    config = make_config("https://127.0.0.1:9/v1", write_prompts(tmp_path / "p.jsonl", 2),
                         endpoints=[{"base_url": "https://127.0.0.1:9/v1", "tls": {"ca_bundle": cli_ca}}])
    run_id = create(engine, config)
    srv = live_app(launch_tls_dirs=str(allowed))

    def change(tls: dict[str, Any], **more: Any) -> httpx.Response:
        eps = [{"base_url": "https://127.0.0.1:9/v1", "tls": tls}]
        return httpx.post(f"{srv.url}/api/runs/{run_id}/settings", json={"changes": {"endpoints": eps, **more}},
                          headers={**SAME, "Origin": srv.url}, timeout=30)

    for tls in ({"ca_bundle": "/etc/passwd"}, {"ca_bundle": str(allowed / ".." / "other" / "ca.pem")},
                {"ca_bundle": str(allowed / "link.pem")}, {"ca_bundle": str(allowed / "sub" / "ca.pem")},
                {"client_cert": "/etc/passwd"}, {"client_cert": str(allowed / "client.pem"), "client_key": "/etc/shadow"},
                {"ca_bundle": str(other / "ca.pem")}):
        r = change(tls)
        assert r.status_code == 400, (tls, r.text)
        assert "outside the folders the dashboard may read TLS files from" in r.json()["detail"], r.text
        assert "SYNTHWATCH_LAUNCH_TLS_DIRS" in r.json()["detail"]
    r = change({"ca_bundle": str(allowed / "missing.pem")})
    assert r.status_code == 400 and "no such file" in r.json()["detail"]
    assert run_row(engine, run_id)["config_version"] == 1  # nothing refused became a version

    # the run's own path (from the command line) is kept when something else changes
    r = change({"ca_bundle": cli_ca}, **{"sampling.temperature": 0.5})
    assert r.status_code == 200, r.text
    # a file inside the folder is accepted, stored resolved
    r = change({"ca_bundle": str(tmp_path / "tls" / "." / "ca.pem"), "client_cert": str(allowed / "client.pem")})
    assert r.status_code == 200, r.text
    tls = orjson.loads(run_row(engine, run_id)["config_json"])["endpoints"][0]["tls"]
    assert tls["ca_bundle"] == str((allowed / "ca.pem").resolve())
    assert tls["client_cert"] == str((allowed / "client.pem").resolve())

