"""Form errors beside their fields, all at once (#19 item 12), and the tokenizer a form may set (#19 item 5).

The start-a-run form and a run's Settings form check everything they can before answering: their own
parsing, the run configuration's validation, the dashboard's limits (dataset folders, key variables,
tokenizer folders). Each problem is shown beside its field (aria-invalid, aria-describedby) and listed in a
summary at the top, with what was entered kept. Every request here goes to a real dashboard on a real port.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import write_prompts

from synthwatch.app import tokenizer_limits
from synthwatch.app.launch import LaunchError
from synthwatch.settings import Settings
from synthwatch.settings_policy import Context, PolicyError, check_change
from synthwatch.store import versions
from tests.workerkit import make_config, run_row, run_to_end, wait_for


def field_errors(html: str) -> dict[str, str]:
    """Field name -> the message shown beside it."""
    return {m[0]: m[1] for m in re.findall(r'data-field-error="([^"]+)">(.*?)</span>', html)}


def control(html: str, name: str) -> str:
    """The tag of the form control named ``name``."""
    m = re.search(rf'<(?:input|textarea|select) name="{re.escape(name)}"[^>]*>', html)
    assert m, name
    return m.group(0)


def assert_beside(html: str, name: str) -> None:
    """The control is marked invalid and described by its own message."""
    tag = control(html, name)
    fid = "f-" + name.replace(".", "-")
    assert f'id="{fid}"' in tag and 'aria-invalid="true"' in tag and f'aria-describedby="{fid}-error"' in tag, tag
    assert f'id="{fid}-error" data-field-error="{name}"' in html


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    data, toks, other = tmp_path / "data", tmp_path / "tokenizers", tmp_path / "other"
    for d in (data, toks, other):
        d.mkdir()
    write_prompts(data / "p.jsonl", 3)
    (toks / "mine").mkdir()
    (toks / "mine" / "tokenizer.json").write_text("{}")
    (toks / "empty").mkdir()
    (other / "tok").mkdir()
    (other / "tok" / "tokenizer.json").write_text("{}")
    (toks / "escape").symlink_to(other / "tok", target_is_directory=True)
    return {"tmp": tmp_path, "data": data, "toks": toks, "other": other}


def test_start_form_shows_every_problem_beside_its_field_at_once(live_app: Any, sim: Any,
                                                                  folders: dict[str, Path]) -> None:
    srv = live_app(launch_dataset_dirs=str(folders["data"]), launch_tokenizer_dirs=str(folders["toks"]))
    url = sim()
    form = {"name": "all-at-once", "dataset": str(folders["other"] / "p.jsonl"), "endpoints": url,
            "model": "sim-reasoner", "concurrency": "lots", "temperature": "9", "api_key_env": "HOME",
            "tokenizer": str(folders["other"] / "tok"), "timeout_s": "30", "stream": "on"}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post("/runs/new", data=form, follow_redirects=False)
        assert r.status_code == 400
        errs = field_errors(r.text)
        assert set(errs) == {"dataset", "concurrency", "temperature", "api_key_env", "tokenizer"}, errs
        assert "outside the folders the dashboard may read datasets from" in errs["dataset"]
        assert errs["concurrency"] == "expected a whole number, got &#39;lots&#39;"
        assert "must be between 0 and 5" in errs["temperature"]  # the settings policy's bound (#34)
        assert "may not be used from the dashboard" in errs["api_key_env"]
        assert "SYNTHWATCH_LAUNCH_TOKENIZER_DIRS" in errs["tokenizer"]
        for name in errs:
            assert_beside(r.text, name)
        assert 'aria-invalid' not in control(r.text, "model")  # a good field is not marked
        assert "Cannot start the run: 5 problems" in r.text and 'href="#f-concurrency"' in r.text
        # what was typed is kept, escaped
        assert 'value="lots"' in control(r.text, "concurrency") and 'value="9"' in control(r.text, "temperature")
        assert f'value="{folders["other"] / "tok"}"' in control(r.text, "tokenizer")
        # the JSON API lists the same problems with their fields
        a = c.post("/api/runs", json={"dataset": form["dataset"], "endpoints": [url], "model": "sim-reasoner",
                                      "temperature": 9, "api_key_env": "HOME", "tokenizer": "/etc"})
        assert a.status_code == 400
        assert {e["field"] for e in a.json()["errors"]} == {"dataset", "temperature", "api_key_env", "tokenizer"}
        assert "may not be used from the dashboard" in a.json()["detail"]
        # a field left empty is named once (not again by RunConfig's validation)
        r = c.post("/runs/new", data={**form, "model": "", "endpoints": ""}, follow_redirects=False)
        errs = field_errors(r.text)
        assert errs["model"].startswith("required") and errs["endpoints"].startswith("give at least one")
        assert "<br>" not in errs["model"] and "<br>" not in errs["endpoints"]
        assert c.get("/api/runs").json()["runs"] == []


def test_start_form_sets_a_packaged_or_allowed_tokenizer(live_app: Any, sim: Any, engine: Any,
                                                        folders: dict[str, Path]) -> None:
    srv = live_app(launch_dataset_dirs=str(folders["data"]), launch_tokenizer_dirs=str(folders["toks"]))
    url = sim()
    form = {"dataset": str(folders["data"] / "p.jsonl"), "endpoints": url, "model": "sim-reasoner",
            "concurrency": "2", "stream": "on", "timeout_s": "30"}
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        refused = {
            str(folders["toks"] / "escape"): "outside the folders",  # a symlink out of the allowed folder
            f"{folders['toks']}/../other/tok": "outside the folders",
            str(folders["other"] / "missing"): "outside the folders",  # the same answer: no existence oracle
            "/etc": "outside the folders",
            "deepseek-ai/DeepSeek-V3": "outside the folders",  # a hub name: relative to the dashboard's folder
            str(folders["toks"] / "missing"): "no such folder",
            str(folders["toks"] / "empty"): "has no tokenizer files",
        }
        for i, (tok, needle) in enumerate(refused.items()):
            r = c.post("/runs/new", data={**form, "name": f"t{i}", "tokenizer": tok}, follow_redirects=False)
            assert r.status_code == 400 and needle in field_errors(r.text).get("tokenizer", ""), (tok, r.text[-800:])
        for i, (tok, stored) in enumerate([("deepseek-v4", "deepseek-v4"),
                                           (str(folders["toks"] / "mine"), str((folders["toks"] / "mine").resolve()))]):
            r = c.post("/runs/new", data={**form, "name": f"ok{i}", "tokenizer": tok}, follow_redirects=False)
            assert r.status_code == 303, r.text[-2000:]
            run_id = int(r.headers["location"].rsplit("/", 1)[1])
            wait_for(lambda rid=run_id: run_row(engine, rid)["status"] == "completed", timeout_s=60)
            cfg = orjson.loads(run_row(engine, run_id)["config_json"])
            assert cfg["tokenizer"] == {"name_or_path": stored, "chat_template": None, "trust_remote_code": False}
        # "Start a run like this" carries the tokenizer
        like = c.get("/runs/new", params={"like": run_id}).text
        assert f'value="{stored}"' in control(like, "tokenizer")


def test_tokenizer_limits(folders: dict[str, Path]) -> None:
    s = Settings(db="x", launch_tokenizer_dirs=str(folders["toks"]))
    assert tokenizer_limits.check_tokenizer("deepseek-v4", s) == "deepseek-v4"
    assert tokenizer_limits.check_tokenizer("mine", s, folders["toks"]) == str((folders["toks"] / "mine").resolve())
    with pytest.raises(LaunchError, match="outside the folders"):
        tokenizer_limits.check_tokenizer(str(folders["other"] / "tok"), s)
    with pytest.raises(LaunchError, match="outside the folders"):
        tokenizer_limits.check_tokenizer(str(folders["toks"] / "mine"), Settings(db="x", launch_tokenizer_dirs=" "))
    assert Settings(db="x").launch_tokenizer_dirs == "tokenizers"
    ctx = Context(s)
    patch = check_change({"tokenizer": {"name_or_path": "deepseek-v4"}}, {}, ctx)
    assert patch == {"tokenizer": {"name_or_path": "deepseek-v4", "trust_remote_code": False}}
    with pytest.raises(PolicyError, match="tokenizer.trust_remote_code"):
        check_change({"tokenizer": {"trust_remote_code": True}}, {}, ctx)
    with pytest.raises(PolicyError, match="tokenizer.chat_template: .*outside the folders"):
        check_change({"tokenizer": {"chat_template": "/etc/passwd"}}, {}, ctx)
    assert check_change({"model": "m"}, {}, ctx) == {"model": "m"}


def test_settings_form_shows_every_problem_and_a_tokenizer_change_is_a_new_version(
        live_app: Any, sim: Any, engine: Any, prompts: Any, folders: dict[str, Path]) -> None:
    url = sim(seed=3)
    run_id, status = run_to_end(engine, make_config(url, prompts(3)))
    assert status == "completed"
    srv = live_app(launch_tokenizer_dirs=str(folders["toks"]))
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        page = c.get(f"/runs/{run_id}/repair").text
        assert control(page, "set.tokenizer.name_or_path")
        bad = {"set.sampling.temperature": "hot", "set.sampling.top_p": "7", "set.tokenizer.name_or_path": "/etc",
               "set.sampling.extra_body": "{not json", "reason": "three at once"}
        r = c.post(f"/runs/{run_id}/settings", data=bad, follow_redirects=False)
        assert r.status_code == 400
        errs = field_errors(r.text)
        assert set(errs) == {"set.sampling.temperature", "set.sampling.top_p", "set.tokenizer.name_or_path",
                             "set.sampling.extra_body"}, errs
        assert errs["set.sampling.temperature"] == "not a number: &#39;hot&#39;"
        assert "must be between 0 and 1" in errs["set.sampling.top_p"]  # the settings policy, at its field (#34)
        assert "SYNTHWATCH_LAUNCH_TOKENIZER_DIRS" in errs["set.tokenizer.name_or_path"]
        for name in errs:
            assert_beside(r.text, name)
        assert 'value="hot"' in control(r.text, "set.sampling.temperature")  # kept as typed
        assert "{not json</textarea>" in r.text and 'value="three at once"' in r.text
        assert run_row(engine, run_id)["config_version"] == 1  # nothing was saved
        # the API refuses the same tokenizer
        a = c.post(f"/api/runs/{run_id}/settings", json={"changes": {"tokenizer.name_or_path": "/etc"}})
        assert a.status_code == 400 and "outside the folders" in a.json()["detail"]
        a = c.post(f"/api/runs/{run_id}/settings", json={"changes": {"tokenizer": {"name_or_path": "deepseek-v4",
                                                                                  "trust_remote_code": True}}})
        assert a.status_code == 400 and "trust_remote_code" in a.json()["detail"]
        # fixed: a new version with the tokenizer, the first one kept
        r = c.post(f"/runs/{run_id}/settings", data={"set.tokenizer.name_or_path": "deepseek-v4",
                                                     "reason": "token view"}, follow_redirects=False)
        assert r.status_code == 303, r.text[-2000:]
        with engine.connect() as conn:
            vs = versions.list_versions(conn, run_id)
        assert [v["version"] for v in vs] == [1, 2]
        assert [(ch["path"], ch["new"]) for ch in vs[1]["changes"]] == [("tokenizer", {
            "name_or_path": "deepseek-v4", "chat_template": None, "trust_remote_code": False})]
        assert vs[1]["reason"] == "token view"
        assert orjson.loads(run_row(engine, run_id)["config_json"])["tokenizer"]["name_or_path"] == "deepseek-v4"
        # the same value again changes nothing
        r = c.post(f"/runs/{run_id}/settings", data={"set.tokenizer.name_or_path": "deepseek-v4"})
        assert r.status_code == 400 and "nothing changes" in r.text
