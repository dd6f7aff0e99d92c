"""The exports API and pages name no server file paths (#25 item 6: "manifests shown over HTTP name no server
paths"). The reproduction: the manifest in GET /api/runs/{id}/exports carried the export's full path, the
database's path and the run config's dataset, tokenizer, chat template and TLS paths. A run whose configuration
names absolute paths everywhere is exported from a real dashboard; every export response and page is searched for
the folders, while the manifest file beside the export keeps them for whoever has the file system.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
from test_export import VARIED, make_run
from workerkit import wait_for


def test_export_responses_and_pages_name_no_server_path(engine: Any, db_path: Path, live_app: Any,
                                                       tmp_path: Path) -> None:
    secret_dir = tmp_path / "srv-layout-7f3a"
    paths = {"dataset": {"path": str(secret_dir / "prompts.jsonl")},
             "endpoints": [{"base_url": "https://127.0.0.1:9/v1", "api_key_env": "MY_KEY",
                            "tls": {"ca_bundle": str(secret_dir / "ca.pem"), "client_cert": str(secret_dir / "c.pem")}}],
             "tokenizer": {"name_or_path": "deepseek-v4", "chat_template": str(secret_dir / "tpl.jinja")},
             "sampling": {"stop": ["/end"]}}
    run_id = make_run(engine, VARIED, snapshot_extra=paths)
    srv = live_app()
    folders = (str(tmp_path), str(secret_dir), str(db_path.parent))
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        started = c.post(f"/api/runs/{run_id}/exports", json={"format": "sharegpt"})
        assert started.status_code == 202, started.text
        job_id = started.json()["id"]

        def done() -> Any:
            job = c.get(f"/api/runs/{run_id}/exports/{job_id}").json()
            return job if job["status"] != "running" else None

        job = wait_for(done, timeout_s=60, what="the export")
        assert job["status"] == "done", job
        on_disk = db_path.parent / "exports" / (job["file_name"].rsplit(".", 1)[0] + ".manifest.json")
        if not on_disk.exists():
            on_disk = db_path.parent / "exports" / (job["file_name"] + ".manifest.json")
        full = on_disk.read_text()
        assert str(secret_dir / "prompts.jsonl") in full and str(db_path) in full  # the file keeps them
        responses = {
            "POST response": started.text,
            "job": c.get(f"/api/runs/{run_id}/exports/{job_id}").text,
            "list": c.get(f"/api/runs/{run_id}/exports").text,
            "manifest download": c.get(job["manifest_url"]).text,
            "export page": c.get(f"/runs/{run_id}/export").text,
            "job page": c.get(f"/runs/{run_id}/exports/{job_id}").text,
            "job fragment": c.get(f"/runs/{run_id}/exports/{job_id}/progress").text,
            "jobs fragment": c.get(f"/runs/{run_id}/exports/list").text,
        }
        for where, text in responses.items():
            for folder in folders:
                assert folder not in text, f"{where} names the server path {folder}"
        served = orjson.loads(responses["manifest download"])
        assert served["file"] == {k: v for k, v in orjson.loads(full)["file"].items() if k != "path"}
        assert served["run"]["database"] == f"sqlite:///{db_path.name}"
        cfg = served["run_config"]
        assert cfg["dataset"]["path"] == "prompts.jsonl" and cfg["tokenizer"]["chat_template"] == "tpl.jinja"
        assert cfg["endpoints"][0]["tls"]["ca_bundle"] == "ca.pem" and cfg["endpoints"][0]["base_url"].startswith("https")
        assert cfg["sampling"]["stop"] == ["/end"]  # model text is not a path
        assert c.get(job["download_url"]).status_code == 200
