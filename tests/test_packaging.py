"""The wheel carries the templates and static files, and finds them once installed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_ships_templates_and_static_files(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("localui-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (ROOT / "templates").rglob("*.html"):
        assert f"localui/templates/{template.relative_to(ROOT / 'templates')}" in names
    for asset in (ROOT / "static").iterdir():
        assert f"localui/static/{asset.name}" in names
    assert "localui/cli.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "localui = localui.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_python_dash_m_localui_is_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "localui", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "serve" in out.stdout and "demo" in out.stdout
