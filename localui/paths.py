"""Where templates and static files are: inside the installed package, or at the
root of a checkout (an editable install or ``python -m localui`` from the repo)."""

from __future__ import annotations

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
