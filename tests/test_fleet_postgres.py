"""A fleet on PostgreSQL: agent workers and two ``localui serve`` processes, one database.

The workers are processes of their own that run a payout agent until it pauses
for approval; its tool pays out (one line in a shared ledger) only once
approved. Two real servers, each with that agent registered, take ten
concurrent approvals of one pause; the database is the only thing they share.
Then the server goes away under a running app and comes back.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import helpers
import httpx
import pytest
from helpers import LocalServer, all_at_once, decide, free_port, start_localui

if TYPE_CHECKING:
    from conftest import Ledger, PgRaw, PgSeeded

pytestmark = pytest.mark.postgres

LOCALUI = Path(sys.executable).parent / "localui"
START_TIMEOUT_S = 30.0
JSON = {"Accept": "application/json"}

#: The fleet's agent, as a fleet would ship it: a module the workers run and the
#: servers load with ``--agents``. Settings come from the environment.
FLEET_AGENTS = '''\
"""payout-bot: pays an order out once a person approves it."""

import asyncio
import json
import os
import re
import sys
import uuid

from fastaiagent import Agent, interrupt, tool
from fastaiagent.checkpointers.postgres import PostgresCheckpointer
from fastaiagent.llm.message import MessageRole
from fastaiagent.testing import FunctionModel


def _respond(messages):
    if messages[-1].role == MessageRole.tool:
        return "Done: " + str(messages[-1].content)
    text = next(str(m.content) for m in reversed(messages) if m.role == MessageRole.user)
    order = re.search(r"order (\\S+)", text).group(1)
    return "", [{"id": "call_0", "name": "pay_out", "arguments": {"order_id": order}}]


@tool(name="pay_out", register=False)
def pay_out(order_id: str) -> str:
    """Pay an order out, once a person approved it."""
    decision = interrupt("payout_approval", {"order_id": order_id})
    if not decision.approved:
        return f"payout of {order_id} declined"
    line = json.dumps({"effect": "pay_out", "order_id": order_id, "pid": os.getpid()}) + "\\n"
    fd = os.open(os.environ["FLEET_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return f"paid out {order_id}"


def payout_bot():
    return Agent(
        name="payout-bot",
        system_prompt="Pay out the order named, after approval.",
        llm=FunctionModel(_respond, model="payout-bot"),
        tools=[pay_out],
        checkpointer=PostgresCheckpointer(
            os.environ["FLEET_DSN"], schema=os.environ["FLEET_SCHEMA"]
        ),
    )


async def _pause(order):
    agent = payout_bot()
    execution_id = str(uuid.uuid4())
    result = await agent.arun(f"Pay out order {order}", execution_id=execution_id)
    print(execution_id, result.status, flush=True)


if __name__ == "__main__":
    asyncio.run(_pause(sys.argv[1]))
'''


# --- a cluster of the test's own, to stop and start -----------------------------


def postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.fail("no PostgreSQL server binaries (run scripts/test.sh, which installs them)")
    return Path(found[-1]).parent


@dataclass
class Cluster:
    """A throwaway PostgreSQL cluster, run as the ``postgres`` user when we are root."""

    directory: Path
    port: int
    bin: Path

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(
            command, cwd=self.directory, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def init(self) -> None:
        self._run(
            "initdb", "-D", str(self.directory / "data"), "-A", "trust", "-U", "postgres",
            "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.directory / "data"), "-l", str(self.directory / "log"),
            "-w", "-t", "60", "-o", options, "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.directory / "data"), "-m", mode, "-w", "stop")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    # Not under /tmp, which the postgres user may not reach here.
    directory = Path(tempfile.mkdtemp(prefix="localui-fleet-pg-", dir="/var/tmp"))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres")
    made = Cluster(directory, free_port(), postgres_bin())
    try:
        made.init()
        made.start()
        yield made
    finally:
        if (directory / "data" / "postmaster.pid").exists():
            made.stop("immediate")
        shutil.rmtree(directory, ignore_errors=True)


# --- servers ------------------------------------------------------------------


def start_server(
    dsn: str, schema: str, app_schema: str, workdir: Path, name: str, env: dict[str, str]
) -> LocalServer:
    return start_localui(
        [
            "serve",
            "--store",
            dsn,
            "--pg-schema",
            schema,
            "--pg-app-schema",
            app_schema,
            "--agents",
            f"{workdir / 'fleet_agents.py'}:payout_bot",
            "--no-auth",
        ],  # fmt: skip
        cwd=workdir,
        log=workdir / f"{name}.log",
        env=env,
        ready="/approvals.json",
        timeout=START_TIMEOUT_S,
    )


@dataclass
class Fleet:
    dsn: str
    schema: str
    app_schema: str
    workdir: Path
    env: dict[str, str]
    ledger: Ledger
    servers: list[LocalServer] = field(default_factory=list)

    @property
    def raw(self) -> PgRaw:
        from conftest import PgRaw

        return PgRaw(self.dsn, self.schema)

    def serve(self, name: str) -> LocalServer:
        server = start_server(self.dsn, self.schema, self.app_schema, self.workdir, name, self.env)
        self.servers.append(server)
        return server

    def pause(self, order: str) -> tuple[str, float]:
        """A worker process runs the agent until it pauses: ``(execution_id, when)``,
        ``when`` being the moment it reported the pause written."""
        worker = subprocess.Popen(
            [sys.executable, str(self.workdir / "fleet_agents.py"), order],
            cwd=self.workdir,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert worker.stdout is not None
        line = worker.stdout.readline()
        when = time.monotonic()
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        execution_id, status = line.split()
        assert status == "paused", line
        return execution_id, when


def make_fleet(dsn: str, schema: str, app_schema: str, workdir: Path, ledger: Ledger) -> Fleet:
    (workdir / "fleet_agents.py").write_text(FLEET_AGENTS)
    env = {
        **os.environ,
        "FASTAIAGENT_TRACE_ENABLED": "false",
        "FASTAIAGENT_LOCAL_DB": str(workdir / "sdk-local.db"),
        "FLEET_DSN": dsn,
        "FLEET_SCHEMA": schema,
        "FLEET_LEDGER": str(ledger.path),
    }
    return Fleet(dsn, schema, app_schema, workdir, env, ledger)


@pytest.fixture
def fleet(pg_seeded: PgSeeded, ledger: Ledger, tmp_path: Path) -> Iterator[Fleet]:
    """The seeded runs in a fresh schema of the test server, with the payout agent."""
    from conftest import PgRaw, copy_pg_store, pg_name

    schema, app_schema = pg_name("fastaiagent"), pg_name("localui")
    workdir = tmp_path / "fleet"
    workdir.mkdir()
    copy_pg_store(pg_seeded.dsn, pg_seeded.schema, pg_seeded.dsn, schema)
    made = make_fleet(pg_seeded.dsn, schema, app_schema, workdir, ledger)
    try:
        yield made
    finally:
        for server in made.servers:
            server.stop()
        PgRaw(pg_seeded.dsn, schema).drop()
        PgRaw(pg_seeded.dsn, app_schema).drop()


def card(server: LocalServer, execution_id: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        return helpers.card(client, execution_id)


def approve(
    server: LocalServer, execution_id: str, checkpoint_id: str, approver: str
) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        return decide(client, execution_id, checkpoint_id, approver=approver, reason="race")


# --- the race ----------------------------------------------------------------


def test_ten_approvals_over_two_servers_pay_out_once(fleet: Fleet) -> None:
    run, _ = fleet.pause("F-1001")
    a, b = fleet.serve("server-a"), fleet.serve("server-b")
    shown = card(a, run)
    assert card(b, run)["checkpoint_id"] == shown["checkpoint_id"]
    rows_before = len(fleet.raw.rows(run))

    responses = all_at_once(
        10, lambda i: approve((a, b)[i % 2], run, shown["checkpoint_id"], f"approver-{i}")
    )

    statuses = [r.status_code for r in responses]
    wins, conflicts = statuses.count(200), statuses.count(409)
    errors = len(statuses) - wins - conflicts
    said = [r.json()["error"]["message"] for r in responses if r.status_code == 409]
    print(
        f"\nfleet race on PostgreSQL, 2 servers x 5 approvals: {wins} win, {conflicts} "
        f"conflicts ({sum('already approved' in m for m in said)} 'already approved', "
        f"{sum('being approved' in m for m in said)} 'being approved'), {errors} errors"
    )
    assert [s for s in statuses if s >= 500] == [], a.output() + b.output()
    assert (wins, conflicts, errors) == (1, 9, 0), statuses
    [won] = [r.json() for r in responses if r.status_code == 200]
    assert (won["status"], won["output"]) == ("completed", "Done: paid out F-1001")
    winner = won["decision"]["approver"]
    for words in said:
        assert re.match(rf"This pause was (already|being) approved by {winner} ", words), words
    # One resume: the tool's payout once, the next turn and the run end once.
    assert [e["effect"] for e in fleet.ledger.effects()] == ["pay_out"]
    ends = [r["status"] for r in fleet.raw.rows(run) if r["step_type"] == "run_end"]
    assert ends == ["completed"]
    assert len(fleet.raw.rows(run)) == rows_before + 2
    decided = fleet.raw.query(
        f"SELECT actor, outcome FROM {fleet.app_schema}.localui_decisions WHERE execution_id = %s",
        (run,),
    )
    assert decided == [{"actor": winner, "outcome": "completed"}]
    for server in (a, b):
        seen = httpx.get(f"{server.url}/approvals/{run}.json", timeout=10).json()
        assert seen["pending"] is None
        assert [d["approver"] for d in seen["decisions"]] == [winner]


# --- a pause made elsewhere, seen live on both servers -----------------------


@dataclass
class EventStream:
    """Reads one SSE stream in a thread and keeps each event with when it came."""

    url: str
    events: list[tuple[float, str, str]] = field(default_factory=list)
    opened: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Sent with the request (a session cookie).
    headers: dict[str, str] = field(default_factory=dict)
    #: The response's headers, once it opened.
    answered: dict[str, str] = field(default_factory=dict)

    def read(self) -> None:
        event, data = "message", []
        try:
            with httpx.stream(
                "GET", self.url, headers=self.headers, timeout=httpx.Timeout(10, read=30)
            ) as response:
                self.answered = dict(response.headers)
                self.opened.set()
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].removeprefix(" "))
                    elif not line and data:
                        with self.lock:
                            self.events.append((time.monotonic(), event, "\n".join(data)))
                        event, data = "message", []
        except httpx.HTTPError:
            pass  # the server stopped: the stream is over
        finally:
            self.opened.set()

    def first(self, event: str, text: str) -> float | None:
        with self.lock:
            return next((t for t, e, d in self.events if e == event and text in d), None)


def test_a_pause_made_by_a_worker_appears_on_both_servers_within_a_second(
    fleet: Fleet,
) -> None:
    servers = (fleet.serve("server-a"), fleet.serve("server-b"))
    streams = [EventStream(f"{s.url}/live/approvals") for s in servers]
    readers = [threading.Thread(target=s.read, daemon=True) for s in streams]
    for reader in readers:
        reader.start()
    for stream in streams:
        assert stream.opened.wait(10)
    deadline = time.monotonic() + 10
    while not all(s.first("queue", "approval") for s in streams):
        assert time.monotonic() < deadline, "no queue fragment at the start of a stream"
        time.sleep(0.05)

    run, paused_at = fleet.pause("F-2002")

    deadline = paused_at + 5
    while time.monotonic() < deadline and not all(s.first("queue", run) for s in streams):
        time.sleep(0.02)
    seen = [s.first("queue", run) for s in streams]
    for server in servers:
        server.stop()
    for reader in readers:
        reader.join(timeout=15)
    assert all(t is not None for t in seen), f"the pause never reached a stream: {seen}"
    delays = [t - paused_at for t in seen if t is not None]
    print(f"\npause on both servers' queues after {', '.join(f'{d:.2f} s' for d in delays)}")
    assert max(delays) < 1.0, delays


# --- the server goes away and comes back ---------------------------------------


def test_the_app_says_the_server_is_gone_and_recovers_when_it_returns(
    cluster: Cluster, pg_seeded: PgSeeded, ledger: Ledger, tmp_path: Path
) -> None:
    from conftest import copy_pg_store

    copy_pg_store(pg_seeded.dsn, pg_seeded.schema, cluster.dsn, "fastaiagent")
    workdir = tmp_path / "outage"
    workdir.mkdir()
    fleet = make_fleet(cluster.dsn, "fastaiagent", "localui", workdir, ledger)
    run, _ = fleet.pause("F-3003")
    server = fleet.serve("server")
    paused = pg_seeded.id("paused-1")
    live = EventStream(f"{server.url}/live/approvals")
    reader = threading.Thread(target=live.read, daemon=True)
    try:
        assert httpx.get(f"{server.url}/runs.json", timeout=10).status_code == 200
        shown = card(server, run)
        reader.start()
        deadline = time.monotonic() + 10
        while live.first("queue", run) is None:
            assert time.monotonic() < deadline, "the live queue did not start"
            time.sleep(0.05)

        cluster.stop()

        gone = f"PostgreSQL at 127.0.0.1:{cluster.port} is not answering"
        for url in ("/runs.json", f"/runs/{paused}.json", "/approvals.json"):
            response = httpx.get(f"{server.url}{url}", timeout=30)
            assert response.status_code == 503, (url, response.text)
            assert response.json()["error"]["message"].startswith(gone), response.text
        page = httpx.get(f"{server.url}/", timeout=30)
        assert page.status_code == 503 and gone in page.text
        refused = approve(server, run, shown["checkpoint_id"], "Ann")
        assert refused.status_code == 503, refused.text
        assert server.process.poll() is None
        # The open live stream is told, with the same words.
        while live.first("store-status", "The store cannot be read right now") is None:
            assert time.monotonic() - deadline < 20, "the live stream was not told"
            time.sleep(0.05)
        told = live.first("store-status", "The store cannot be read right now")

        cluster.start()
        back = time.monotonic()
        while True:
            response = httpx.get(f"{server.url}/runs.json", timeout=30)
            if response.status_code == 200:
                break
            assert time.monotonic() - back < 10, response.text
            time.sleep(0.1)
        print(f"\nanswering again {time.monotonic() - back:.2f} s after the server came back")
        assert httpx.get(f"{server.url}/runs/{paused}", timeout=10).status_code == 200
        done = approve(server, run, shown["checkpoint_id"], "Ann")
        assert done.status_code == 200, done.text
        assert [e["order_id"] for e in ledger.effects()] == ["F-3003"]
        # ...and told again when it is back: the banner goes.
        while not any(
            t > (told or 0) and e == "store-status" and "hidden" in d for t, e, d in live.events
        ):
            assert time.monotonic() - back < 10, "the live stream was not told of the recovery"
            time.sleep(0.05)
        # The live stream opened before the outage carries on: a new pause reaches it.
        later, paused_at = fleet.pause("F-3004")
        while live.first("queue", later) is None:
            assert time.monotonic() - paused_at < 5, "the live feed did not recover"
            time.sleep(0.05)
    finally:
        server.stop()
        reader.join(timeout=15)


def test_notifications_ride_out_the_server_going_away(
    cluster: Cluster, pg_seeded: PgSeeded, ledger: Ledger, tmp_path: Path
) -> None:
    """The watcher outlives an outage: it says so once in the server's log, and again
    when the server is back; a pause written after is announced, nothing twice."""
    import base64
    from collections import Counter

    from conftest import copy_pg_store

    from bench.receiver import Receiver

    copy_pg_store(pg_seeded.dsn, pg_seeded.schema, cluster.dsn, "fastaiagent")
    workdir = tmp_path / "notify-outage"
    workdir.mkdir()
    fleet = make_fleet(cluster.dsn, "fastaiagent", "localui", workdir, ledger)
    secret = workdir / "secret"
    secret.write_text("whsec_" + base64.b64encode(b"an outage's webhook signing key!").decode())
    log = workdir / "server.log"
    waiting = len(pg_seeded.ids("paused"))
    with Receiver() as receiver:
        server = start_localui(
            [
                "serve",
                "--store",
                cluster.dsn,
                "--no-auth",
                "--notify-on",
                "paused",
                "--webhook",
                receiver.url + "/hook",
                "--webhook-secret-file",
                str(secret),
            ],
            cwd=workdir,
            log=log,
            env=fleet.env,
            timeout=START_TIMEOUT_S,
        )
        try:
            receiver.wait_for(lambda r: len(r) >= waiting)
            cluster.stop()
            gone = f"notifications: PostgreSQL at 127.0.0.1:{cluster.port} is not answering"
            deadline = time.monotonic() + 20
            while gone not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.1)
            time.sleep(1.0)  # more polls fail: said once, and the server stays up
            assert server.process.poll() is None
            cluster.start()
            later, _ = fleet.pause("F-6006")
            got = receiver.wait_for(lambda r: len(r) >= waiting + 1)
            time.sleep(1.0)  # a few polls more: nothing comes twice
        finally:
            server.stop()
    said = log.read_text()
    assert said.count(gone) == 1, said
    assert said.index("notifications work again") > said.index(gone), said
    announced = [r.body for r in receiver.requests()]
    assert any(later.encode() in body for body in announced)
    seen = Counter(r.headers["webhook-id"] for r in receiver.requests())
    assert len(seen) == waiting + 1 and max(seen.values()) == 1
    assert len(got) == waiting + 1


def test_serve_says_in_one_line_that_a_stopped_server_is_not_answering(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.stop()
    done = subprocess.run(
        [str(LOCALUI), "serve", "--store", cluster.dsn],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"localui: PostgreSQL at 127.0.0.1:{cluster.port} is not answering: connection failed: "
        f'connection to server at "127.0.0.1", port {cluster.port} failed: Connection refused '
        "Is the server running on that host and accepting TCP/IP connections?"
    ]


def test_the_first_pages_after_a_server_restart_answer_on_fresh_connections(
    cluster: Cluster, pg_seeded: PgSeeded, ledger: Ledger, tmp_path: Path
) -> None:
    """Pooled connections are not checked each time they are lent (a round trip each):
    one that outlived a restart fails its first statement, and the read is done again
    on a fresh connection, so no one sees the restart they did not wait through."""
    from conftest import copy_pg_store

    copy_pg_store(pg_seeded.dsn, pg_seeded.schema, cluster.dsn, "fastaiagent")
    workdir = tmp_path / "restart"
    workdir.mkdir()
    fleet = make_fleet(cluster.dsn, "fastaiagent", "localui", workdir, ledger)
    server = fleet.serve("server")
    paused = pg_seeded.id("paused-1")
    pages = ("/runs.json", "/", f"/runs/{paused}", "/attention.json", "/metrics")
    try:
        for url in pages:
            assert httpx.get(f"{server.url}{url}", timeout=10).status_code == 200, url
        cluster.stop()
        cluster.start()
        for url in pages:
            response = httpx.get(f"{server.url}{url}", timeout=30)
            assert response.status_code == 200, (url, response.text[:300])
    finally:
        server.stop()
