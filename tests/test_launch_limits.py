"""The start-a-run form and POST /api/runs may only name allowed key variables and read allowed folders.

The reproduction from the issue: the form with ``api_key_env=HOME`` would have made the worker send the
dashboard's HOME as a bearer token to whatever URL the form gave. Every refusal here goes through a real
dashboard on a real port; the allowed cases start real runs against the simulator.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import write_prompts

from synthwatch.app import launch
from synthwatch.settings import Settings
from tests.workerkit import run_row, wait_for


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    allowed.mkdir()
    other.mkdir()
    write_prompts(allowed / "p.jsonl", 3)
    write_prompts(other / "p.jsonl", 3)
    (allowed / "link.jsonl").symlink_to(other / "p.jsonl")  # a file link out of the folder
    (allowed / "sub").symlink_to(other, target_is_directory=True)  # a folder link out of it
    (tmp_path / "alias").symlink_to(allowed, target_is_directory=True)  # a link to the allowed folder
    return {"tmp": tmp_path, "allowed": allowed, "other": other}


def _form(dataset: str, url: str, **extra: str) -> dict[str, str]:
    return {"dataset": dataset, "endpoints": url, "model": "sim-reasoner", "concurrency": "2", "stream": "on",
            "timeout_s": "30", "max_attempts": "1", **extra}


def test_form_refuses_key_variables_not_meant_for_it(live_app: Any, sim: Any, dirs: dict[str, Path]) -> None:
    srv = live_app(launch_dataset_dirs=str(dirs["allowed"]), launch_key_envs="LAB_KEY, OTHER_KEY")
    url = sim()
    data = str(dirs["allowed"] / "p.jsonl")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for name in ("HOME", "PATH", "SYNTHWATCH_AUTH_TOKEN", "SYNTHWATCH_KEY_", "synthwatch_key_x",
                     "XSYNTHWATCH_KEY_A", "LAB_KEY2", "LAB"):
            r = c.post("/runs/new", data=_form(data, url, name=f"k-{name}", api_key_env=name), follow_redirects=False)
            assert r.status_code == 400, (name, r.status_code)
            assert "may not be used from the dashboard" in r.text and "SYNTHWATCH_LAUNCH_KEY_ENVS" in r.text, name
            a = c.post("/api/runs", json={"dataset": data, "endpoints": [url], "model": "sim-reasoner",
                                          "api_key_env": name, "name": f"api-{name}"})
            assert a.status_code == 400 and "may not be used from the dashboard" in a.json()["detail"], name
        r = c.get("/api/runs").json()["runs"]
        assert r == [], "no refused form created a run"


def test_form_accepts_prefixed_and_listed_key_variables(live_app: Any, sim: Any, dirs: dict[str, Path],
                                                        engine: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SYNTHWATCH_KEY_TEST", "sk-launch-1")
    monkeypatch.setenv("LAB_KEY", "sk-launch-2")
    srv = live_app(launch_dataset_dirs=str(dirs["allowed"]), launch_key_envs="LAB_KEY,OTHER_KEY")
    url = sim()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        for name in ("SYNTHWATCH_KEY_TEST", "LAB_KEY"):
            r = c.post("/runs/new", data=_form(str(dirs["allowed"] / "p.jsonl"), url, name=f"ok-{name}",
                                               api_key_env=name), follow_redirects=False)
            assert r.status_code == 303, r.text[-2000:]
            run_id = int(r.headers["location"].rsplit("/", 1)[1])
            wait_for(lambda rid=run_id: run_row(engine, rid)["status"] == "completed", timeout_s=60)
            assert run_row(engine, run_id)["n_ok"] == 3


@pytest.mark.slow
def test_form_refuses_datasets_outside_the_allowed_folders(live_app: Any, sim: Any, dirs: dict[str, Path],
                                                           engine: Any) -> None:
    srv = live_app(launch_dataset_dirs=f"{dirs['allowed']}{os.pathsep}{dirs['tmp'] / 'alias'}")
    url = sim()
    allowed, other = dirs["allowed"], dirs["other"]
    refused = [
        str(other / "p.jsonl"),  # outside
        str(other / "missing.jsonl"),  # outside and missing: the same answer (no existence oracle)
        f"{allowed}/../other/p.jsonl",  # `..` out of the folder
        str(allowed / "link.jsonl"),  # a file symlink out of the folder
        str(allowed / "sub" / "p.jsonl"),  # through a directory symlink out of the folder
        "/etc/passwd",
        "../../../../../../etc/passwd",  # relative: resolved against the dashboard's working directory
        "~/.ssh/id_rsa",
    ]
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for i, path in enumerate(refused):
            r = c.post("/runs/new", data=_form(path, url, name=f"d{i}"), follow_redirects=False)
            assert r.status_code == 400, (path, r.status_code)
            assert "outside the folders the dashboard may read datasets from" in r.text, (path, r.text[-1500:])
            a = c.post("/api/runs", json={"dataset": path, "endpoints": [url], "model": "sim-reasoner",
                                          "name": f"api-d{i}"})
            assert a.status_code == 400 and "outside the folders" in a.json()["detail"], path
        # inside, also through `..` that stays inside and through a link to the allowed folder itself
        for i, path in enumerate([str(allowed / "p.jsonl"), f"{allowed}/../allowed/p.jsonl",
                                  str(dirs["tmp"] / "alias" / "p.jsonl")]):
            r = c.post("/runs/new", data=_form(path, url, name=f"in{i}"), follow_redirects=False)
            assert r.status_code == 303, (path, r.text[-2000:])
            run_id = int(r.headers["location"].rsplit("/", 1)[1])
            wait_for(lambda rid=run_id: run_row(engine, rid)["status"] == "completed", timeout_s=60)


def test_default_dataset_folder_is_data_under_the_working_directory(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "x.db"))
    assert settings.launch_dataset_dirs == "data" and settings.launch_key_envs == ""
    (tmp_path / "data").mkdir()
    assert launch.dataset_dirs(settings, tmp_path) == [(tmp_path / "data").resolve()]
    assert launch.check_dataset_path(tmp_path / "data" / "x.jsonl", settings, tmp_path) == \
        (tmp_path / "data" / "x.jsonl").resolve()
    with pytest.raises(launch.LaunchError, match="outside the folders"):
        launch.check_dataset_path(tmp_path / "x.jsonl", settings, tmp_path)
    with pytest.raises(launch.LaunchError, match="outside the folders"):
        launch.check_dataset_path(tmp_path / "data-other" / "x.jsonl", settings, tmp_path)  # a prefix is not inside
    with pytest.raises(launch.LaunchError, match="outside the folders"):
        launch.check_dataset_path(tmp_path / "x.jsonl", Settings(db="x", launch_dataset_dirs=" "), tmp_path)
