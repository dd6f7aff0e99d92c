"""`synthwatch probe`: real requests to the simulator, the report and the verdict."""

from __future__ import annotations

import orjson
from conftest import ROOT, run_cli

from synthwatch.probe import ProbeOptions, probe

R1_TEMPLATE = str(ROOT / "tests" / "data" / "r1_style_chat_template.jinja")


def test_probe_a_vllm_like_server_with_an_r1_style_template(sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(token_ids="deepseek", reasoning_field="reasoning", seed=2)
    report = probe(ProbeOptions(url, "sim-reasoner", tokenizer="deepseek-v4", chat_template=R1_TEMPLATE))
    assert report.server["kind"] == "vLLM" and report.server["version"] == "0.32.0" and report.server["model_listed"]
    assert report.reasoning["non_streamed"] == "reasoning" == report.reasoning["streamed"]
    ids = report.token_ids
    assert ids["returned"] and ids["prompt_tail"] == [128804, 128821, 201] and ids["prompt_prefilled_think"]
    assert ids["completion_ends_with_eos"] and ids["finish_reason"] == "stop" and ids["think_single_ids"]
    tok = report.tokenizer
    assert tok is not None and tok["problem"] == "template_drops_reasoning" and tok["reasoning_survives"] is False
    assert tok["prompt_matches_server"] is True  # the R1-style template renders the prompt vLLM-like
    assert tok["as_generated_span"].endswith("<｜end▁of▁sentence｜>")
    assert report.ready and report.verdict.startswith("READY WITH CAVEATS: vLLM 0.32.0; reasoning in 'reasoning'")
    assert "the chat template drops the answer's reasoning" in report.verdict
    assert report.settings["request_token_ids"] is True and report.settings["reasoning.mode"] == "reasoning"
    assert report.settings["export --format tokens"] == "--template-drops-past-reasoning"
    assert report.tool_calls["parsed"] is True and report.tool_calls["finish_reason"] == "tool_calls"
    assert report.tool_calls["calls"] == report.tool_calls["streamed_calls"] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'}]


def test_probe_with_a_template_that_keeps_reasoning(sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(token_ids="deepseek", reasoning_field="reasoning_content", seed=4)
    report = probe(ProbeOptions(url, "sim-reasoner", tokenizer="deepseek-v4", chat_template="deepseek-v4"))
    tok = report.tokenizer
    assert tok is not None and tok["problem"] is None and tok["reasoning_survives"] is True
    assert tok["trained_span"].endswith("<｜end▁of▁sentence｜>")
    # synthwatch's deepseek-v4 template prefills "<think>" without the newline: not the server's prompt
    assert tok["prompt_matches_server"] is False
    assert report.reasoning["non_streamed"] == "reasoning_content"
    assert "prompt ids differ from the server's" in report.verdict


def test_probe_inline_reasoning_after_a_prefilled_think(sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="inline-no-open", seed=5)
    report = probe(ProbeOptions(url, "sim-reasoner"))
    assert report.reasoning["non_streamed"] == "inline-no-open"
    assert report.settings["reasoning.mode"] == "inline" and report.settings["reasoning.prefilled_open"] is True
    assert report.tokenizer is None and report.ready


def test_probe_cli_says_not_ready_when_no_reasoning_arrives(sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="none", seed=6)
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("NOT READY: no reasoning arrives") and "vLLM 0.32.0" in lines[-1]
    assert any(line.startswith("settings:") for line in lines)
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner", "--json")
    report = orjson.loads(proc.stdout)
    assert proc.returncode == 1 and report["ready"] is False and report["reasoning"]["non_streamed"] == "none"


def test_probe_cli_ready_and_unreachable(sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(token_ids="deepseek", reasoning_field="reasoning", seed=7)
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner", "--tokenizer", "deepseek-v4",
                   "--chat-template", R1_TEMPLATE)
    assert proc.returncode == 0, proc.stderr
    assert "prefilled <think> yes (the tokenizer's <think> id 128821); completion ends with EOS yes" in proc.stdout
    # without a tokenizer, DeepSeek-V4's <think> id at the end of the prompt is recognised
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner")
    assert "prefilled <think> yes (the prompt ends with DeepSeek-V4's <think> id)" in proc.stdout, proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("READY")
    proc = run_cli("probe", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--timeout", "3")
    assert proc.returncode == 2 and "cannot reach http://127.0.0.1:9/v1" in proc.stderr


def test_the_start_a_run_form_offers_the_probe(sim, live_app) -> None:  # type: ignore[no-untyped-def]
    import httpx

    url = sim(token_ids="deepseek", reasoning_field="reasoning_content", seed=8)
    srv = live_app()
    form = {"dataset": "", "endpoints": url, "model": "sim-reasoner", "reasoning_mode": "auto", "stream": "on"}
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        assert 'formaction="/runs/new/probe"' in c.get("/runs/new").text
        r = c.post("/runs/new/probe", data=form)
        assert r.status_code == 200, r.text[-2000:]
        assert 'data-testid="probe-verdict">READY' in r.text and "vLLM 0.32.0" in r.text
        assert '<option value="reasoning_content" selected>' in r.text  # the form follows the probe
        assert "request_token_ids = True" in r.text and "tool calls parse" in r.text
        r = c.post("/runs/new/probe", data={**form, "endpoints": "http://127.0.0.1:9/v1"})
        assert r.status_code == 400 and "probe: cannot reach http://127.0.0.1:9/v1" in r.text
        r = c.post("/runs/new/probe", data={**form, "model": ""})
        assert r.status_code == 400 and "give an endpoint base URL and a model" in r.text
        assert c.get("/api/runs").json()["runs"] == []  # a probe starts nothing


def test_probe_default_max_tokens_reaches_content_and_empty_content_is_warned(sim) -> None:  # type: ignore[no-untyped-def]
    # a model that thinks ~600-900 tokens: the default (2048) sees its answer; 512 (the old default) is cut while
    # thinking, and the probe says so and what to do
    url = sim(reasoning_field="reasoning", reasoning_tokens="600-900", content_tokens="10-20", seed=8)
    report = probe(ProbeOptions(url, "sim-reasoner"))
    assert report.reasoning["content_chars"] > 0 and report.reasoning["finish_reason"] == "stop"
    assert report.warnings == [] and report.verdict.startswith("READY")
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner", "--max-tokens", "512")
    warning = next(line for line in proc.stdout.splitlines() if line.startswith("warning:"))
    assert "the content came back empty: the reply was cut at max_tokens = 512 (while thinking" in warning
    assert "--max-tokens 8192" in warning
    assert "content came back empty" in proc.stdout.strip().splitlines()[-1]  # in the verdict's caveats too


def test_probe_extra_body_is_sent_and_validated(sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=9)
    # the simulator honours the template switch: no reasoning at all, on every probe request
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner", "--json",
                   "--extra-body", '{"chat_template_kwargs": {"enable_thinking": false}}')
    report = orjson.loads(proc.stdout)
    assert report["reasoning"]["non_streamed"] == "none" == report["reasoning"]["streamed"]
    assert report["reasoning"]["extra_body_keys"] == ["chat_template_kwargs"]
    # a body key wins over --max-tokens, as in a run: max_completion_tokens 5 leaves no room for content
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner", "--json",
                   "--extra-body", '{"max_completion_tokens": 5}')
    assert "cut at max_tokens = 5" in orjson.loads(proc.stdout)["warnings"][0]
    for bad, needle in (("{not json", "--extra-body is not valid JSON"), ("[1]", "--extra-body must be a JSON object"),
                        ('{"stream": false}', "--extra-body may not set stream")):
        proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner", "--extra-body", bad)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_probe_never_prints_an_extra_body_value(sim) -> None:  # type: ignore[no-untyped-def]
    # a value of --extra-body (it may be a token for a gateway) goes to the endpoint only: the report lists keys
    url = sim(reasoning_field="reasoning", seed=10)
    secret = "sk-extra-" + "q7" * 12
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner", "--json",
                   "--extra-body", orjson.dumps({"user": secret}).decode())
    assert secret not in proc.stdout and secret not in proc.stderr
    assert orjson.loads(proc.stdout)["reasoning"]["extra_body_keys"] == ["user"]


def test_probe_says_whether_the_server_answers_n_choices(sim, live_app) -> None:  # type: ignore[no-untyped-def]
    """#38: samples_in_one_request needs n; the probe asks for n = 2 and says what to set (CLI, report, dashboard)."""
    import httpx

    url = sim(seed=3)
    report = probe(ProbeOptions(url, "sim-reasoner"))
    assert report.n_choices["supported"] is True and report.n_choices["choices"] == 2
    assert report.settings["samples_in_one_request"] is True
    ignores = sim(seed=3, ignore_n=True)
    report = probe(ProbeOptions(ignores, "sim-reasoner"))
    assert report.n_choices["supported"] is False and report.n_choices["choices"] == 1
    assert "the server ignores n" in report.n_choices["detail"]
    assert report.settings["samples_in_one_request"] is False and report.ready  # not a caveat for other runs
    proc = run_cli("probe", "--base-url", url, "--model", "sim-reasoner")
    assert "n choices:  n = 2 answered 2 choices" in proc.stdout, proc.stdout
    assert "with --samples-per-prompt K: --samples-in-one-request (samples_in_one_request = true)" in proc.stdout
    run_line = next(line for line in proc.stdout.splitlines() if line.startswith("run with:"))
    assert "--samples-in-one-request" not in run_line  # only with k samples per prompt: a note, not in the line
    proc = run_cli("probe", "--base-url", ignores, "--model", "sim-reasoner")
    assert "n = 2 answered 1 choice: the server ignores n" in proc.stdout, proc.stdout
    srv = live_app()
    form = {"dataset": "", "endpoints": ignores, "model": "sim-reasoner", "reasoning_mode": "auto", "stream": "on"}
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/runs/new/probe", data=form)
        assert r.status_code == 200, r.text[-2000:]
        assert 'data-testid="probe-n">n in one request: n = 2 answered 1 choice' in r.text
        assert "samples_in_one_request = False" in r.text
