"""What the dashboard may read from disk for a request: the folders a setting allows, and the error a request
gets otherwise (the start form's datasets, tokenizers; synthwatch.app.launch, synthwatch.app.tokenizer_limits)."""

from __future__ import annotations

import os
from pathlib import Path


class LaunchError(Exception):
    """Bad input or a worker that would not start; the message says what and where."""


def allowed_dirs(spec: str, base_dir: Path | None = None) -> list[Path]:
    """A setting's folders (separated by os.pathsep), resolved; relative ones against ``base_dir`` or the cwd."""
    base = base_dir or Path.cwd()
    out = []
    for d in spec.split(os.pathsep):
        if d.strip():
            p = Path(d.strip()).expanduser()
            out.append((p if p.is_absolute() else base / p).resolve())
    return out
