"""``localui serve`` and ``localui demo`` as real processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from conftest import sdk_version
from helpers import LocalServer, start_localui

from localui.backends.sqlite.store import SQLiteStore
from localui.demo.edits import EDITED
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


@pytest.mark.parametrize(
    ("source", "attr", "fragments"),
    [
        (
            "def make_agents(checkpointer, name):\n    raise AssertionError('never called')\n",
            "make_agents",
            ("needs arguments", "checkpointer, name"),
        ),
        (
            "raise RuntimeError('no API key\\nset OPENAI_API_KEY')\n",
            "agent",
            ("RuntimeError", "no API key set OPENAI_API_KEY"),
        ),
        (
            "def make_agents():\n    raise KeyError('REFUND_DB')\n",
            "make_agents",
            ("make_agents() raised KeyError", "REFUND_DB"),
        ),
        ("def make_agents():\n    return {'refund-bot': 1}\n", "make_agents", ("dict",)),
        ("agent = 'refund-bot'\n", "agent", ("str is not a fastaiagent Agent",)),
    ],
    ids=["needs-arguments", "raises-on-import", "factory-raises", "returns-a-dict", "a-string"],
)
def test_serve_an_agents_spec_that_is_not_a_runner(
    cwd: Path,
    tmp_path: Path,
    seeded: Seeded,
    source: str,
    attr: str,
    fragments: tuple[str, ...],
) -> None:
    """Each ends in one line naming the spec, exit 2, and nothing served."""
    agent_file = tmp_path / "my_agents.py"
    agent_file.write_text(source)
    spec = f"{agent_file}:{attr}"
    done = run_cli([LOCALUI, "serve", "--store", str(seeded.path), "--agents", spec], cwd)
    assert done.returncode == 2
    assert_one_line_error(done, repr(spec), *fragments)
    assert "serving" not in done.stdout


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
    # The refund-bot's ten runs, then the chain, team, long-run and failed-fork shapes,
    # a run cancelled, one timed out, and a chain whose agent node timed out: the SDK
    # names that reason for a chain from 1.93 on, before which it is a plain failure.
    chains_say_why = sdk_version() >= (1, 93)
    assert dict(page.counts) == {
        "completed": 3,
        "paused": 8,
        "failed": 3 if chains_say_why else 4,
        "cancelled": 1,
        "timed_out": 2 if chains_say_why else 1,
        "unfinished": 5,
    }


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


#: What ``localui demo`` serves: its scenarios' runs, then the branches it edits of two.
DEMO_RUNS = len(ALL_SCENARIOS) + len(EDITED)


def seeded_demo(url: str, within: float = 120) -> dict[str, Any]:
    """The demo's runs list once its seeding has finished."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        listing: dict[str, Any] = httpx.get(f"{url}/runs.json", timeout=10).json()
        if listing["seeding"] is None or listing["seeding"]["finished"]:
            return listing
        time.sleep(0.2)
    raise AssertionError(f"the demo at {url} was still seeding after {within:.0f} s")


def test_demo_serves_at_once_and_its_runs_arrive_while_it_serves(cwd: Path, tmp_path: Path) -> None:
    """The sign-in line comes first, the empty list answers while the runs are being
    written and says how far the seeding got, and then every run is there."""
    with serving(["demo"], cwd, tmp_path / "demo.log", ready="/signin") as server:
        said = server.output().splitlines()
        sign_in = next(i for i, line in enumerate(said) if "sign in at" in line)
        seeding_line = next(i for i, line in enumerate(said) if "demo runs into" in line)
        assert sign_in < seeding_line
        token = said[sign_in].split("?token=", 1)[1].split()[0]
        auth = {"Authorization": f"Bearer {token}"}
        early = httpx.get(f"{server.url}/runs.json", headers=auth, timeout=10).json()
        assert early["seeding"] is not None and not early["seeding"]["finished"]
        assert early["seeding"]["total"] == DEMO_RUNS
        assert len(early["runs"]) == early["seeding"]["landed"] < DEMO_RUNS
        page = httpx.get(f"{server.url}/", headers=auth, timeout=10).text
        assert re.search(rf"seeding the demo: \d+ of {DEMO_RUNS}", page), page
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            listing = httpx.get(f"{server.url}/runs.json", headers=auth, timeout=10).json()
            if listing["seeding"] is None:
                break
            time.sleep(0.2)
        assert listing["seeding"] is None
        assert len(listing["runs"]) == DEMO_RUNS
        # Two of them are branches the demo edited, recorded as such.
        edited = httpx.get(
            f"{server.url}/decisions.json", params={"kind": "edit"}, headers=auth, timeout=10
        ).json()["decisions"]
        assert sorted(d["approver"] for d in edited) == ["demo", "demo"], edited
        assert all(d["outcome"] == "completed" for d in edited), edited
        assert "seeding the demo" not in httpx.get(f"{server.url}/", headers=auth).text
        assert f"{len(ALL_SCENARIOS)} of {len(ALL_SCENARIOS)} runs seeded" in server.output()


def test_demo_removes_its_temporary_store_when_stopped(cwd: Path, tmp_path: Path) -> None:
    with serving(["demo", "--no-auth"], cwd, tmp_path / "demo.log") as server:
        runs = seeded_demo(server.url)["runs"]
        assert len(runs) == DEMO_RUNS
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=15)
        out = server.output()
    assert code == 0, out
    store = next(line for line in out.splitlines() if "demo runs into" in line)
    temp_dir = Path(store.rsplit(" ", 1)[1]).parent
    assert temp_dir.name.startswith("localui-demo-")
    assert not temp_dir.exists()
    assert list(cwd.iterdir()) == []


def test_demo_stopped_while_seeding_leaves_no_process_behind(cwd: Path, tmp_path: Path) -> None:
    """Ctrl-C while the runs are still being written ends the workers and their children,
    and the temporary store goes with them."""
    with serving(["demo", "--no-auth"], cwd, tmp_path / "demo.log") as server:
        listing = httpx.get(f"{server.url}/runs.json", timeout=10).json()
        assert listing["seeding"] is not None and not listing["seeding"]["finished"]
        workers = _children_of(server.process.pid)
        assert workers, "the demo should be seeding in worker processes"
        # And the scenario each worker has forked, if it is running one right now.
        workers += [child for pid in workers for child in _children_of(pid)]
        server.process.send_signal(signal.SIGINT)
        code = server.process.wait(timeout=15)
        out = server.output()
    assert code == 0, out
    assert "Traceback" not in out
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), f"worker {pid} still runs"
    store = next(line for line in out.splitlines() if "demo runs into" in line)
    assert not Path(store.rsplit(" ", 1)[1]).parent.exists()
    assert list(cwd.iterdir()) == []


def _children_of(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (Linux: read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _is_zombie(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
