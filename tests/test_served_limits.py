"""The real server process: its limits (idle connections, bodies, banner) and the
places a store may lie that this user cannot write or read."""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from helpers import start_localui
from test_cli import LOCALUI, assert_one_line_error, child_env, serving

from localui.limits import HEADER_TIMEOUT
from localui.security import MAX_BODY_BYTES

if TYPE_CHECKING:
    from conftest import Seeded


def as_this_user() -> list[str]:
    """The command prefix that makes file permissions apply to a child: root reads and
    writes anything, so as root the child gives up the two capabilities that let it."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    """An empty working directory for the child."""
    path = tmp_path / "cwd"
    path.mkdir()
    return path


@pytest.fixture
def served(cwd: Path, store_copy: Path, tmp_path: Path) -> Iterator[str]:
    with serving(
        ["serve", "--store", str(store_copy), "--no-auth"], cwd, tmp_path / "serve.log"
    ) as server:
        yield server.url


def test_no_server_banner_and_the_headers_on_a_real_server(served: str) -> None:
    page = httpx.get(f"{served}/")
    assert page.status_code == 200
    assert "server" not in page.headers
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_a_connection_that_never_sends_its_request_is_dropped(served: str) -> None:
    port = int(served.rsplit(":", 1)[1])
    silent = socket.create_connection(("127.0.0.1", port))
    partial = socket.create_connection(("127.0.0.1", port))
    partial.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
    try:
        started = time.monotonic()
        for sock in (silent, partial):
            sock.settimeout(HEADER_TIMEOUT + 10)
            assert sock.recv(1024) == b""  # closed by the server, nothing answered
        assert time.monotonic() - started < HEADER_TIMEOUT + 5
        # A person's request is answered all the while.
        assert httpx.get(f"{served}/runs.json").status_code == 200
    finally:
        silent.close()
        partial.close()


def test_a_body_over_the_cap_is_refused_before_it_is_read(served: str, seeded: Seeded) -> None:
    port = int(served.rsplit(":", 1)[1])
    run = seeded.id("paused-1")
    # Announced too large: answered at once, though not one body byte was sent.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"POST /approvals/{run}/approve HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {50 * MAX_BODY_BYTES}\r\n\r\n".encode()
        )
        head = sock.recv(4096).decode()
    assert head.startswith("HTTP/1.1 413"), head
    # Sent in chunks with no length: refused once the bytes pass the cap.
    chunks = (b"approver=" + b"x" * 65_536 for _ in range(40))
    response = httpx.post(
        f"{served}/approvals/{run}/approve",
        content=chunks,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 413
    assert httpx.get(f"{served}/approvals/{run}.json").json()["pending"] is not None


# --- read-only and unreadable places -------------------------------------------------


def _wal_copy(seeded: Seeded, directory: Path, *, pending_in_wal: bool) -> Path:
    """A copy of the seeded store in WAL mode; with ``pending_in_wal`` a change sits in its
    ``-wal`` file, not yet checkpointed, as a writer that was killed leaves it."""
    directory.mkdir()
    path = directory / "local.db"
    source = sqlite3.connect(f"file:{seeded.path}?mode=ro", uri=True)
    target = sqlite3.connect(path)
    source.backup(target)
    source.close()
    target.execute("PRAGMA journal_mode = WAL")
    target.close()
    if pending_in_wal:
        # A child that exits without closing: the -wal keeps its frames, no checkpoint.
        code = (
            "import os, sqlite3\n"
            f"c = sqlite3.connect({str(path)!r})\n"
            "c.execute('PRAGMA wal_autocheckpoint = 0')\n"
            "c.execute('UPDATE checkpoints SET status = status')\n"
            "c.commit()\n"
            "os._exit(0)\n"
        )
        subprocess.run([_python(), "-c", code], check=True)
        path.with_name("local.db-shm").unlink()
        assert path.with_name("local.db-wal").stat().st_size > 0
    return path


def _python() -> str:
    import sys

    return sys.executable


def _read_only(directory: Path) -> None:
    for item in directory.iterdir():
        item.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    directory.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)


@pytest.fixture
def restore_modes(tmp_path: Path) -> Iterator[list[Path]]:
    """Paths a test made unwritable or unreadable, opened again so they can be removed."""
    changed: list[Path] = []
    yield changed
    for path in changed:
        path.chmod(stat.S_IRWXU)


def test_a_wal_store_in_a_read_only_directory_serves_read_only(
    cwd: Path, tmp_path: Path, seeded: Seeded, restore_modes: list[Path]
) -> None:
    store = _wal_copy(seeded, tmp_path / "shelf", pending_in_wal=False)
    _read_only(store.parent)
    restore_modes.append(store.parent)
    server = start_localui(
        ["serve", "--store", str(store), "--read-only", "--no-auth"],
        cwd=cwd,
        log=tmp_path / "serve.log",
        env=child_env(),
        prefix=as_this_user(),
    )
    try:
        listed = httpx.get(f"{server.url}/runs.json").json()["runs"]
        assert {r["execution_id"] for r in listed} >= {seeded.id("completed")}
        assert httpx.get(f"{server.url}/approvals").status_code == 200
    finally:
        server.stop()
    assert sorted(p.name for p in store.parent.iterdir()) == ["local.db"]


def test_a_wal_store_whose_log_cannot_be_read_says_what_is_missing(
    cwd: Path, tmp_path: Path, seeded: Seeded, restore_modes: list[Path]
) -> None:
    store = _wal_copy(seeded, tmp_path / "shelf", pending_in_wal=True)
    _read_only(store.parent)
    restore_modes.append(store.parent)
    done = subprocess.run(
        [*as_this_user(), LOCALUI, "serve", "--store", str(store), "--read-only"],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = assert_one_line_error(done, "local.db-wal", "local.db-shm", "read-only directory")
    assert "not a SQLite store" not in line


@pytest.mark.parametrize("closed", ["file", "directory"])
def test_an_unreadable_store_is_one_line(
    cwd: Path, tmp_path: Path, seeded: Seeded, restore_modes: list[Path], closed: str
) -> None:
    store = _wal_copy(seeded, tmp_path / "locked", pending_in_wal=False)
    target = store if closed == "file" else store.parent
    target.chmod(0)
    restore_modes.append(target)
    done = subprocess.run(
        [*as_this_user(), LOCALUI, "serve", "--store", str(store), "--read-only"],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = assert_one_line_error(done, str(store), "cannot be read")
    assert "ermission denied" in line
    assert "not a SQLite store" not in line
