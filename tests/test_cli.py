"""``localui serve`` and ``localui demo`` as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from helpers import LocalServer, start_localui

from localui.backends.sqlite.store import SQLiteStore
from localui.demo.scenarios import ALL_SCENARIOS
from localui.records import RunQuery

if TYPE_CHECKING:
    from conftest import Seeded

#: The console script installed beside this interpreter, as a user would type it.
LOCALUI = str(Path(sys.executable).with_name("localui"))


def child_env() -> dict[str, str]:
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    env.pop("FASTAIAGENT_LOCAL_DB", None)
    return env


def run_cli(
    args: Sequence[str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args),
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert lines[0].startswith("localui: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    """An empty working directory for the child, checked by tests that care."""
    path = tmp_path / "cwd"
    path.mkdir()
    return path


def test_serve_a_missing_store(cwd: Path) -> None:
    done = run_cli([sys.executable, "-m", "localui", "serve", "--store", "/nonexistent.db"], cwd)
    assert done.returncode == 2
    assert_one_line_error(done, "/nonexistent.db")
    assert done.stdout == ""


def test_serve_an_agent_module_that_does_not_exist(cwd: Path, seeded: Seeded) -> None:
    done = run_cli(
        [LOCALUI, "serve", "--store", str(seeded.path), "--agents", "nosuchmodule:x"], cwd
    )
    assert_one_line_error(done, "nosuchmodule")


def test_serve_a_malformed_agent_spec(cwd: Path, seeded: Seeded) -> None:
    done = run_cli([LOCALUI, "serve", "--store", str(seeded.path), "--agents", "justaname"], cwd)
    assert_one_line_error(done, "MODULE:ATTR")


def test_serve_refuses_an_agent_bound_to_another_store(
    cwd: Path, tmp_path: Path, store_copy: Path
) -> None:
    elsewhere = tmp_path / "elsewhere" / "other.db"
    agent_file = tmp_path / "my_agents.py"
    agent_file.write_text(
        "from fastaiagent.checkpointers import SQLiteCheckpointer\n"
        "from localui.demo.agent import build_agent\n\n"
        f"agent = build_agent(SQLiteCheckpointer({str(elsewhere)!r}))\n"
    )
    done = run_cli(
        [LOCALUI, "serve", "--store", str(store_copy), "--agents", f"{agent_file}:agent"], cwd
    )
    line = assert_one_line_error(done, str(elsewhere), str(store_copy), "refund-bot")
    assert line.count(str(store_copy)) >= 1
    assert not elsewhere.exists()


@contextmanager
def serving(
    args: Sequence[str],
    cwd: Path,
    log: Path,
    *,
    ready: str = "/runs.json",
    within: float = 30,
) -> Iterator[LocalServer]:
    """A real ``localui`` process, answering 200 on ``ready`` within ``within`` seconds;
    always stopped on the way out. With sign-in on, ``/signin`` is the page that answers
    without a session."""
    server = start_localui(args, cwd=cwd, log=log, env=child_env(), ready=ready, timeout=within)
    try:
        yield server
    finally:
        server.stop()


def test_serve_answers_loopback_and_refuses_a_foreign_host(
    cwd: Path, store_copy: Path, seeded: Seeded, tmp_path: Path
) -> None:
    args = ["serve", "--store", str(store_copy), "--no-auth"]
    with serving(args, cwd, tmp_path / "serve.log") as server:
        base = server.url
        port = base.rsplit(":", 1)[1]
        page = httpx.get(f"{base}/", timeout=10)
        assert page.status_code == 200
        assert seeded.id("crashed-in-tool") in page.text
        listed = httpx.get(f"{base}/runs.json", timeout=10).json()
        assert len(listed["runs"]) == len(seeded.report.runs)
        by_name = httpx.get(f"http://localhost:{port}/runs.json", timeout=10)
        assert by_name.status_code == 200
        foreign = httpx.get(f"{base}/", headers={"Host": "evil.example"}, timeout=10)
        assert foreign.status_code == 400
        cross = httpx.post(f"{base}/", headers={"Origin": "http://evil.example"}, timeout=10)
        assert cross.status_code == 403
        assert server.process.poll() is None
    assert os.listdir(cwd) == []


def test_demo_seed_only_leaves_the_cwd_clean(cwd: Path, tmp_path: Path) -> None:
    target = tmp_path / "demo" / "local.db"
    done = run_cli([LOCALUI, "demo", "--store", str(target), "--seed-only"], cwd)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(target)
    assert f"{len(ALL_SCENARIOS)} runs seeded" in done.stdout
    assert os.listdir(cwd) == []
    seeded = SQLiteStore(target)
    try:
        page = seeded.list_runs(RunQuery(limit=100))
    finally:
        seeded.close()
    assert len(page.runs) == len(ALL_SCENARIOS)
    # The refund-bot's ten runs, then the chain, team, long-run and failed-fork shapes.
    assert dict(page.counts) == {"completed": 3, "paused": 8, "failed": 3, "unfinished": 5}


def test_demo_refuses_an_existing_store(cwd: Path, store_copy: Path) -> None:
    before = store_copy.stat().st_size, store_copy.stat().st_mtime_ns
    done = run_cli([LOCALUI, "demo", "--store", str(store_copy), "--seed-only"], cwd)
    assert done.returncode == 2
    assert_one_line_error(done, str(store_copy), "exists")
    assert (store_copy.stat().st_size, store_copy.stat().st_mtime_ns) == before
    assert os.listdir(cwd) == []


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_quietly_on_ctrl_c_and_sigterm(
    cwd: Path, store_copy: Path, stop: signal.Signals, tmp_path: Path
) -> None:
    args = ["serve", "--store", str(store_copy)]
    with serving(args, cwd, tmp_path / "serve.log", ready="/signin") as server:
        server.process.send_signal(stop)
        code = server.process.wait(timeout=15)
        said = server.output()
        assert code == 0, said
        assert "Traceback" not in said and "KeyboardInterrupt" not in said


def test_demo_removes_its_temporary_store_when_stopped(cwd: Path, tmp_path: Path) -> None:
    # The demo seeds every shape first, a run of 550 rows among them.
    with serving(["demo", "--no-auth"], cwd, tmp_path / "demo.log", within=120) as server:
        runs = httpx.get(f"{server.url}/runs.json", timeout=10).json()["runs"]
        assert len(runs) == len(ALL_SCENARIOS)
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=15)
        out = server.output()
    assert code == 0, out
    store = next(line for line in out.splitlines() if "seeding demo runs into" in line)
    temp_dir = Path(store.rsplit(" ", 1)[1]).parent
    assert temp_dir.name.startswith("localui-demo-")
    assert not temp_dir.exists()
    assert list(cwd.iterdir()) == []
