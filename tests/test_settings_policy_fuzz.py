"""Property tests of the settings policy generated from the settings schema itself (#34).

Every key reachable from RunConfig (the pydantic models, walked by synthwatch.settings_policy.models_of) is a target;
its value is drawn from its own annotation (``st.from_type``) mixed with hostile values (huge numbers, secrets' names,
paths outside the folders, import paths). Each patch goes through every dashboard route that accepts settings. A key
added to the models later is drawn the day it exists, with no new test code. The invariants: no 5xx; a refusal names
the key; nothing the policy refuses is stored; no import happens; no key variable outside the allowlist is accepted.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import httpx
import orjson
import pytest
from conftest import write_prompts
from hypothesis import given
from hypothesis import strategies as st
from workerkit import create, make_config

from synthwatch.app.routes_runs import StartBody
from synthwatch.check_catalog import CHECK_NAMES
from synthwatch.settings import Settings
from synthwatch.settings_policy import recheck_versions, shape
from synthwatch.settings_policy_doc import models_of
from synthwatch.store import versions
from synthwatch.store.db import open_engine

SAME = {"Sec-Fetch-Site": "same-origin"}
CANARY = "sw_policy_fuzz_canary"
HOSTILE = st.sampled_from([
    -(2**63) - 1, 2**63, 2**64, -1, 0, 1e308, float("inf"), "MY_SECRET", "HOME", "/etc/shadow", "../../etc/passwd",
    "this:s", "builtins:print", f"{CANARY}:check", {"X-Leak": "PATH"}, [], {}, None, True, "", "\x00",
])
KEYS = [(k, m, n) for k, m, n in models_of()]
ROUTES = ("POST /api/runs/{id}/settings", "POST /runs/{id}/settings", "POST /api/runs/{id}/checks/settings",
          "POST /runs/{id}/checks/settings", "POST /api/runs", "POST /runs/new")  # what the tests below post to


def from_annotation(ann: Any) -> st.SearchStrategy[Any]:
    if get_origin(ann) in (Union, types.UnionType):
        return st.one_of(*[from_annotation(a) for a in get_args(ann)])
    if ann is Any:
        return st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3)
    if get_origin(ann) is Literal:
        return st.sampled_from(get_args(ann))
    if ann is int:
        return st.integers(-(2**70), 2**70)
    if ann is float:
        return st.floats(allow_nan=False) | st.integers(-(2**65), 2**65)
    if get_origin(ann) is list:
        return st.lists(from_annotation(get_args(ann)[0]), max_size=3)
    if get_origin(ann) is dict:
        k, v = get_args(ann)
        return st.dictionaries(from_annotation(k), from_annotation(v), max_size=3)
    if ann in (str, bool, type(None)):
        return st.from_type(ann) if ann is not str else st.text(max_size=30)
    return HOSTILE  # a type not drawn here: hostile values only


def value_for(model: Any, name: str, depth: int = 0) -> st.SearchStrategy[Any]:
    kind, sub, _ = shape(model, name)
    if sub is not None and depth < 2:
        table = patch_of(sub, depth + 1)
        if kind == "list":
            return st.lists(table, max_size=2) | HOSTILE
        if kind == "dict":
            return st.dictionaries(st.sampled_from(["empty_reasoning", "truncated", "x y", "\x00"]), table,
                                   max_size=2) | HOSTILE
        return table | HOSTILE
    return from_annotation(model.model_fields[name].annotation) | HOSTILE


def patch_of(model: Any, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    names = list(model.model_fields)
    return st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries({n: value_for(model, n, depth) for n in chosen}))


@st.composite
def keyed_patch(draw: Any) -> tuple[str, dict[str, Any]]:
    """(dotted key, nested patch setting it): a key of the schema, with a value drawn from its type."""
    key, model, name = draw(st.sampled_from(KEYS))
    node: Any = draw(value_for(model, name))
    for tok in reversed(re.findall(r"[^.\[\]*]+|\[\]|\*", key)):
        node = [node] if tok == "[]" else {"truncated": node} if tok == "*" else {tok: node}
    return key, node


@pytest.fixture
def world(tmp_path: Path, live_app: Any, db_path: Path) -> dict[str, Any]:
    mods = tmp_path / "mods"
    mods.mkdir()
    marker = tmp_path / "imported"
    (mods / f"{CANARY}.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n"
                                       "def check(record):\n    return True\n")
    sys.path.insert(0, str(mods))
    (tmp_path / "data").mkdir()
    engine = open_engine(str(db_path))
    run_id = create(engine, make_config("http://127.0.0.1:9/v1", write_prompts(tmp_path / "p.jsonl", 2)))
    limits = {"launch_dataset_dirs": str(tmp_path / "data"), "launch_tls_dirs": str(tmp_path / "tls"),
              "launch_tokenizer_dirs": str(tmp_path / "toks")}
    srv = live_app(**limits)
    yield {"srv": srv, "engine": engine, "run_id": run_id, "marker": marker, "tmp": tmp_path,
           "settings": Settings(db=str(db_path), **limits)}
    sys.path.remove(str(mods))


def _key_envs(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [v for k, v in node.items() if k == "api_key_env" and isinstance(v, str)]
        out += [x for k, v in node.items() if k == "headers_env" and isinstance(v, dict) for x in v.values()]
        return out + [x for v in node.values() for x in _key_envs(v)]
    if isinstance(node, list):
        return [x for v in node for x in _key_envs(v)]
    return []


def _invariants(w: dict[str, Any], r: httpx.Response, key: str) -> None:
    assert r.status_code < 500, (key, r.status_code, r.text[:2000])
    if r.status_code == 400 and r.headers.get("content-type", "").startswith("application/json"):
        body = r.json()
        if "refused" in body:
            assert body["refused"] and all(k in body["detail"] for k in body["refused"]), body
    with w["engine"].connect() as conn:
        history = versions.history(conn, w["run_id"])
        current = versions.current(conn, w["run_id"])[1]
    assert recheck_versions(history, current, w["settings"]) == [], "the dashboard stored what the policy refuses"
    assert [n for n in _key_envs(current) if not n.startswith("SYNTHWATCH_KEY_")] == [], current
    assert not w["marker"].exists() and CANARY not in sys.modules, "a drawn import path was imported"


def _form_value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _dotted(patch: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in patch.items():
        if isinstance(v, dict) and v and k != "extra_body":
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@given(drawn=keyed_patch())
def test_random_patches_to_every_key_through_every_settings_route(world: dict[str, Any],
                                                                  drawn: tuple[str, dict[str, Any]]) -> None:
    key, patch = drawn
    srv, rid = world["srv"], world["run_id"]
    h = {**SAME, "Origin": srv.url}
    try:
        body = orjson.dumps({"changes": patch})
    except (TypeError, orjson.JSONEncodeError):
        body = None  # a number JSON cannot carry: the form routes still get it as text
    with httpx.Client(base_url=srv.url, headers=h, timeout=60) as c:
        if body is not None:
            r = c.post(f"/api/runs/{rid}/settings", content=body, headers={"Content-Type": "application/json"})
            _invariants(world, r, key)
            if isinstance(patch.get("checks"), dict):
                r = c.post(f"/api/runs/{rid}/checks/settings", content=orjson.dumps(patch["checks"]),
                           headers={"Content-Type": "application/json"})
                _invariants(world, r, key)
        form = {f"set.{k}": _form_value(v) for k, v in _dotted(patch).items()}
        r = c.post(f"/runs/{rid}/settings", data=form, follow_redirects=False)
        _invariants(world, r, key)


CHECK_FORM_FIELDS = [f"{f}__{n}" for n in CHECK_NAMES for f in (
    "shown", "computed", "enabled", "threshold", "window", "min_records", "auto_pause", "auto_pause_shown")]
CHECK_FORM_FIELDS += ["canary_every_n", "webhook_url"]


def _switched(c: httpx.Client, rid: int) -> tuple[set[str], set[str]]:
    got = c.get(f"/api/runs/{rid}/checks").json()
    return set(got["settings"]["disabled"]), {n for n, r in got["rules"].items() if not r["enabled"]}


@given(form=st.dictionaries(st.sampled_from(CHECK_FORM_FIELDS), st.text(max_size=12) | st.sampled_from(
    ["on", "1", "", "50%", "-1", "1e400", "nan", str(2**64), "http://127.0.0.1:9/hook"]), max_size=10))
def test_random_checks_form_posts_switch_off_only_the_rows_they_show(world: dict[str, Any],
                                                                     form: dict[str, str]) -> None:
    """The checks form (#35): a check is switched off only by a post that shows its row (shown__NAME) without its
    box; a post that omits fields leaves every check as it was."""
    srv, rid = world["srv"], world["run_id"]
    with httpx.Client(base_url=srv.url, headers={**SAME, "Origin": srv.url}, timeout=60) as c:
        disabled, off = _switched(c, rid)
        r = c.post(f"/runs/{rid}/checks/settings", data=form, follow_redirects=False)
        _invariants(world, r, "checks form")
        disabled_now, off_now = _switched(c, rid)
    for name in disabled_now - disabled:
        assert f"shown__{name}" in form and f"computed__{name}" not in form, (name, form)
    for name in off_now - off:
        assert f"shown__{name}" in form and f"enabled__{name}" not in form, (name, form)


START_FIELDS = list(StartBody.model_fields)


@given(fields=st.lists(st.sampled_from(START_FIELDS), max_size=4, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({n: from_annotation(StartBody.model_fields[n].annotation) | HOSTILE
                                         for n in names})))
def test_random_start_requests_never_start_what_the_policy_refuses(world: dict[str, Any],
                                                                   fields: dict[str, Any]) -> None:
    missing = str(world["tmp"] / "data" / "missing.jsonl")  # inside the folder, absent: a run is never launched
    body = {"dataset": missing, "endpoints": ["http://127.0.0.1:9/v1"], "model": "m", **fields}
    body["dataset"] = missing if not isinstance(body.get("dataset"), str) else body["dataset"]
    srv = world["srv"]
    with httpx.Client(base_url=srv.url, headers={**SAME, "Origin": srv.url}, timeout=60) as c:
        try:
            r = c.post("/api/runs", content=orjson.dumps(body), headers={"Content-Type": "application/json"})
        except (TypeError, orjson.JSONEncodeError):
            r = None
        if r is not None:
            assert r.status_code < 500, (body, r.text[:2000])
            assert r.status_code != 201 or body["dataset"] != missing
        form = {k: _form_value(v) for k, v in body.items()}
        r = c.post("/runs/new", data=form, follow_redirects=False)
        assert r.status_code < 500, (form, r.text[:2000])
        runs = c.get("/api/runs").json()["runs"]
    assert [x["id"] for x in runs] == [world["run_id"]], "a refused start made a run"


def test_coverage_of_the_schema_is_reported(record_property: Any) -> None:
    leaves = [k for k, m, n in KEYS if shape(m, n)[1] is None]
    # printed in the run's summary (tests/conftest.py pytest_terminal_summary), under xdist too
    record_property("coverage", f"settings policy fuzz: {len(KEYS)} keys ({len(leaves)} leaves) of the settings "
                    f"schema, {len(START_FIELDS)} start-request fields, through {len(ROUTES)} routes: "
                    f"{', '.join(ROUTES)}")
    assert len(leaves) > 100 and "judge.endpoint.api_key_env" in [k for k, _m, _n in KEYS]
