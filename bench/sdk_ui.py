"""The SDK's bundled UI (``fastaiagent ui``), installed in a venv of its own.

``fastaiagent[ui]`` pulls in FastAPI and ``uvicorn[standard]``, whose uvloop
and httptools uvicorn picks up by itself: installed into the project's venv
they would change how ``localui serve`` runs too. So the SDK UI gets its own
venv, with the same SDK version as the project's, created on first use.
Each server runs as its users get it: the SDK UI on uvloop and httptools,
localui on asyncio and h11 (its dependency is plain ``uvicorn``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path


def sdk_version() -> str:
    return version("fastaiagent")


def ensure_venv(path: Path, log: Callable[[str], None]) -> Path:
    """A venv at ``path`` with ``fastaiagent[ui]`` at the project's SDK version."""
    wanted = sdk_version()
    cli = path / "bin" / "fastaiagent"
    python = path / "bin" / "python"
    if cli.exists():
        code = "from importlib.metadata import version; print(version('fastaiagent'))"
        have = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, check=False
        )
        if have.returncode == 0 and have.stdout.split()[0] == wanted:
            return path
    log(f"sdk-ui: creating {path} with fastaiagent[ui]=={wanted} (once)")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(path)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"fastaiagent[ui]=={wanted}",
        ],
        check=True,
    )
    return path


def installed(path: Path) -> dict[str, str]:
    """Versions of what matters in the SDK UI's venv, for the report."""
    python = path / "bin" / "python"
    names = ("fastaiagent", "fastapi", "starlette", "uvicorn", "uvloop", "httptools")
    code = (
        "from importlib.metadata import version\n"
        f"for n in {names!r}:\n"
        "    try: print(n, version(n))\n"
        "    except Exception: print(n, '-')\n"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
