"""Where templates and static files are: inside the installed package, or at the
root of a checkout (an editable install or ``python -m localui`` from the repo); and
where localui keeps what it can make again (indexes, compiled templates)."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(f"localui cannot find its {name}/ folder beside {_PACKAGE}")


def templates_dir() -> Path:
    return _find("templates")


def static_dir() -> Path:
    return _find("static")


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/localui``, else ``~/.cache/localui`` (not made here)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "localui"
