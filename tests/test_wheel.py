"""A wheel built from the repo installs into a fresh virtual environment and works away from the checkout.

The fresh venv gets only the wheel; its third-party dependencies are made visible through a
.pth file pointing at the test environment's site-packages (installing transformers & co again
would only re-test pip). Everything synthwatch itself needs — templates, static files (htmx from
npm), migrations, demo prompts, chat templates — must come from the wheel.
"""

from __future__ import annotations

import site
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
from conftest import HTTP_TIMEOUT_S, ROOT, require, wait_http_ready


@pytest.mark.slow
def test_wheel_installs_and_works_away_from_checkout(tmp_path: Path, prompts) -> None:  # type: ignore[no-untyped-def]
    require((ROOT / "synthwatch/static/vendor/htmx.min.js").exists(), "run ./dev setup (htmx from npm) first")
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("synthwatch-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("synthwatch/templates/base.html", "synthwatch/static/vendor/htmx.min.js",
                   "synthwatch/static/app.css", "synthwatch/migrations/env.py",
                   "synthwatch/migrations/versions/0001_initial.py", "synthwatch/data/demo_prompts.jsonl",
                   "synthwatch/data/chat_templates/deepseek-v4.jinja"):
        assert needed in names, f"{needed} missing from the wheel"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    vsite = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip())
    (vsite / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(vsite), str(wheel)],
                   check=True, capture_output=True, timeout=300)

    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run([str(py), "-c", "import synthwatch; print(synthwatch.__file__)"], cwd=away, env=env,
                           check=True, capture_output=True, text=True).stdout
    assert str(vsite) in where and str(ROOT) not in where

    db = away / "w.db"
    sim = subprocess.Popen([str(py), "-m", "synthwatch", "simulate", "--port", "0"], cwd=away, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = sim.stdout.readline() if sim.stdout else ""
        assert "listening on" in line, line
        base = line.split("listening on", 1)[1].strip()
        data = prompts(5)
        run = subprocess.run([str(py), "-m", "synthwatch", "run", "--dataset", str(data), "--base-url", base,
                              "--model", "sim-reasoner", "--db", str(db), "--name", "w", "--quiet"],
                             cwd=away, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    finally:
        sim.terminate()
        sim.wait(10)

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = subprocess.Popen([str(py), "-m", "synthwatch", "serve", "--db", str(db), "--port", str(port)],
                             cwd=away, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}", serve)
        r = httpx.get(f"http://127.0.0.1:{port}/runs", timeout=HTTP_TIMEOUT_S)
        assert r.status_code == 200 and "synthwatch" in r.text
        js = httpx.get(f"http://127.0.0.1:{port}/static/vendor/htmx.min.js", timeout=HTTP_TIMEOUT_S)
        assert js.status_code == 200 and len(js.content) > 10_000
    finally:
        serve.terminate()
        serve.wait(10)
