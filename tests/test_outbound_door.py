"""One door out (#34): no module but synthwatch/outbound.py opens an outbound HTTP client, so a path added later
cannot go around its deadline, reply limits, proxy/netrc policy and redaction. A static check over the package's
source (like tests/test_import_graph.py): HTTP client libraries are not imported elsewhere, and no aiohttp session,
connector or one-off request, urllib opener or raw client socket is made elsewhere. The simulator is exempt (it is
a server, a tool for the demo and tests)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "synthwatch"
DOOR = PACKAGE / "outbound.py"
EXEMPT = (PACKAGE / "simulator",)
CLIENT_MODULES = ("httpx", "requests", "urllib3", "http.client", "urllib.request", "pycurl", "httplib2", "aiohttp.client")
# calls that open a client or a connection: a session, a connector, a one-off request, an opener, a raw socket
CLIENT_CALLS = {"ClientSession", "TCPConnector", "UnixConnector", "urlopen", "build_opener", "OpenerDirector",
                "HTTPConnection", "HTTPSConnection", "create_connection", "open_connection"}


def violations(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "outbound.py" or any(path.is_relative_to(root / e.name) for e in EXEMPT):
            continue
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(root.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                names = []
            for name in names:
                if any(name == m or name.startswith(m + ".") for m in CLIENT_MODULES):
                    out.append(f"{rel}:{node.lineno}: imports {name}")
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if called in CLIENT_CALLS or (isinstance(f, ast.Attribute) and called == "request"
                                              and isinstance(f.value, ast.Name) and f.value.id == "aiohttp"):
                    out.append(f"{rel}:{node.lineno}: calls {called}")
    return out


def test_no_module_but_the_outbound_client_opens_an_http_client() -> None:
    found = violations(PACKAGE)
    assert not found, "outbound requests go through synthwatch/outbound.py only:\n" + "\n".join(found)


def test_the_outbound_module_is_where_sessions_are_made() -> None:
    text = DOOR.read_text()
    assert "aiohttp.ClientSession(" in text and "trust_env=False" in text


def test_a_second_door_is_found(tmp_path: Path) -> None:
    """The check itself: each way around the door is caught, with its file and line."""
    import shutil

    tree = tmp_path / "synthwatch"
    shutil.copytree(PACKAGE, tree, ignore=shutil.ignore_patterns("static", "templates", "data", "__pycache__"))
    extra = {
        "app/sneaky.py": "import httpx\n",
        "quality/sneaky2.py": "import urllib.request\n",
        "workers/sneaky3.py": "import aiohttp\nsession = aiohttp.ClientSession()\n",
        "review/sneaky4.py": "from aiohttp import request\nasync def f():\n    import aiohttp\n"
                            "    return aiohttp.request('GET', 'http://x')\n",
        "export/sneaky5.py": "from urllib.request import urlopen\nurlopen('http://x')\n",
    }
    for rel, code in extra.items():
        (tree / rel).write_text(code)
    found = "\n".join(violations(tree))
    for needle in ("app/sneaky.py:1: imports httpx", "quality/sneaky2.py:1: imports urllib.request",
                   "workers/sneaky3.py:2: calls ClientSession", "review/sneaky4.py:4: calls request",
                   "export/sneaky5.py:1: imports urllib.request", "export/sneaky5.py:2: calls urlopen"):
        assert needle in found, found
