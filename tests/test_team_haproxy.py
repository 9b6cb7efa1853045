"""A desk for a team: two ``localui serve`` replicas on one PostgreSQL store behind a
real HAProxy, round-robin, no sticky sessions, sign-in on.

Driven as people would: one sign-in, then pages that land on either replica; live
pages that hear a pause written by a worker whichever replica serves them; ten
approvals of one pause at once (carried out once); every pause announced once by the
two replicas together; and a replica killed with ``kill -9`` in the middle of an
approval, whose decision the other replica carries out when its claim's lease runs
out, while the desk goes on answering through the survivor.
"""

# The ``crash_store`` fixture is imported from test_crash_approvals, and the test
# names it as a parameter, which pyflakes takes for a redefinition.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from helpers import LocalServer, all_at_once, card, decide, free_port, start_localui
from test_cli import LOCALUI, run_cli
from test_crash_approvals import (  # noqa: F401  (crash_store: a fixture)
    CRASH_AGENT,
    LEASE,
    CrashStore,
    _wait_until_decided,
    crash_store,
)
from test_fleet_postgres import EventStream

from bench.haproxy import REPLICA_HEADER, Balancer
from bench.receiver import Receiver

pytestmark = pytest.mark.postgres

LINK = re.compile(r"\?token=(\S+)")


def replica(
    crash: CrashStore, name: str, port: int, receiver: Receiver, secret: Path
) -> LocalServer:
    """One replica: sign-in on, the payout-bot registered, announcing pauses."""
    env = dict(crash.env)
    env["CRASH_HOLDS"] = str(crash.workdir / f"holds-{name}")
    Path(env["CRASH_HOLDS"]).mkdir(exist_ok=True)
    return start_localui(
        [
            "serve",
            *crash.store_args,
            "--agents",
            f"{CRASH_AGENT}:payout_bot",
            "--claim-lease",
            LEASE,
            "--notify-on",
            "paused",
            "--webhook",
            receiver.url + "/hook",
            "--webhook-secret-file",
            str(secret),
        ],  # fmt: skip
        cwd=crash.workdir,
        log=crash.workdir / f"{name}-{time.monotonic_ns()}.log",
        env=env,
        ready="/static/localui.css",
        port=port,
    )


@contextmanager
def team(crash: CrashStore) -> Iterator[tuple[Balancer, dict[str, LocalServer], Receiver, str]]:
    """HAProxy over replicas ``a`` and ``b``, a webhook receiver both announce to, and
    the sign-in token of an approver added with ``localui users add``."""
    flags = list(crash.store_args)
    at = flags.index("--pg-schema")
    del flags[at : at + 2]
    added = run_cli([LOCALUI, "users", "add", "Ann", "--role", "operator", *flags], crash.workdir)
    assert added.returncode == 0, added.stderr
    token = LINK.search(added.stdout)
    assert token is not None
    secret = crash.workdir / "webhook-secret"
    secret.write_text("whsec_" + base64.b64encode(b"the team desk's webhook key!!!!!").decode())
    with Receiver() as receiver:
        ports = {"a": free_port(), "b": free_port()}
        replicas = {n: replica(crash, n, p, receiver, secret) for n, p in ports.items()}
        try:
            addresses = [(n, f"127.0.0.1:{p}") for n, p in ports.items()]
            with Balancer(free_port(), addresses, crash.workdir) as balancer:
                yield balancer, replicas, receiver, token.group(1)
        finally:
            for server in replicas.values():
                server.stop()


def served_by(answer: httpx.Response) -> str:
    return answer.headers.get(REPLICA_HEADER, "")


@pytest.mark.parametrize("crash_store", ["postgres"], indirect=True)
def test_two_replicas_behind_haproxy_act_as_one_desk(crash_store: CrashStore) -> None:
    crash = crash_store
    first, second, *waiting = crash.runs
    with team(crash) as (balancer, replicas, receiver, token):
        desk = httpx.Client(base_url=balancer.url, timeout=60)
        # Sign in once, through the balancer.
        signed = desk.get(f"/?token={token}", follow_redirects=True)
        assert signed.status_code == 200 and "Ann · operator" in signed.text
        (cookie,) = desk.cookies.jar
        # Browse: every page is signed in, whichever replica answers it.
        seen: Counter[str] = Counter()
        for path in ("/", "/approvals", f"/runs/{first}", "/decisions", f"/runs/{second}") * 2:
            answer = desk.get(path)
            assert answer.status_code == 200 and "Ann · operator" in answer.text, answer.text[-600:]
            seen[served_by(answer)] += 1
        assert set(seen) == {"a", "b"}, seen

        # Live pages, one on each replica, hear a pause a worker writes.
        streams: dict[str, EventStream] = {}
        readers = []
        for _ in range(6):
            stream = EventStream(
                f"{balancer.url}/live/approvals",
                headers={"Cookie": f"{cookie.name}={cookie.value}"},
            )
            reader = threading.Thread(target=stream.read, daemon=True)
            reader.start()
            assert stream.opened.wait(10)
            readers.append(reader)
            streams.setdefault(stream.answered.get(REPLICA_HEADER.lower(), ""), stream)
            if {"a", "b"} <= set(streams):
                break
        assert {"a", "b"} <= set(streams), list(streams)
        from bench import crash_agent

        agent = crash_agent.payout_bot()
        try:
            later = asyncio.run(crash_agent.pause(agent, "O9"))
        finally:
            agent._checkpointer.close()
        deadline = time.monotonic() + 10
        while not all(streams[n].first("queue", later) for n in ("a", "b")):
            assert time.monotonic() < deadline, "the new pause never reached both live pages"
            time.sleep(0.05)

        # Ten approvals of one pause at once, over both replicas: carried out once.
        shown = card(desk, first)

        def approve(_: int) -> httpx.Response:
            with httpx.Client(base_url=balancer.url, timeout=60, cookies=desk.cookies) as one:
                return decide(one, first, shown["checkpoint_id"], approver="Ann")

        statuses = sorted(r.status_code for r in all_at_once(10, approve))
        assert statuses == [200] + [409] * 9, statuses
        assert len(crash.effects("pay_out", first)) == 1
        assert crash.run_ends(first) == ["completed"]

        # kill -9 the replica that holds an approval: the other carries it out.
        for name in ("a", "b"):
            (crash.workdir / f"holds-{name}" / "after-sdk-claim").write_text("")
        held = card(desk, second)
        threading.Thread(
            target=lambda: _quietly(desk, second, held["checkpoint_id"]), daemon=True
        ).start()
        deadline = time.monotonic() + 30
        holder = ""
        while not holder:
            assert time.monotonic() < deadline, "no replica reached the hold point"
            for name in ("a", "b"):
                if (crash.workdir / f"holds-{name}" / "after-sdk-claim.reached").exists():
                    holder = name
            time.sleep(0.02)
        survivor = "b" if holder == "a" else "a"
        (crash.workdir / f"holds-{survivor}" / "after-sdk-claim").unlink()
        os.kill(replicas[holder].process.pid, signal.SIGKILL)
        replicas[holder].process.wait()
        decision = _wait_until_decided(crash, second, replicas[survivor])
        assert (decision.outcome, decision.actor) == ("completed", "Ann")
        assert crash.run_ends(second) == ["completed"]
        assert len(crash.effects("pay_out", second)) == 1
        # The desk goes on through the survivor, with the same session.
        for _ in range(4):
            answer = desk.get("/approvals")
            assert answer.status_code == 200 and "Ann · operator" in answer.text
            assert served_by(answer) == survivor
        assert crash.waiting() == {*waiting, later}

        # Every pause announced once by the two replicas together.
        pauses = {first, second, *waiting, later}
        receiver.wait_for(lambda got: all(any(p.encode() in r.body for r in got) for p in pauses))
        time.sleep(1.0)  # a few polls more: nothing comes twice
        ids = Counter(r.headers["webhook-id"] for r in receiver.requests())
        assert max(ids.values()) == 1, ids
        announced = Counter(p for r in receiver.requests() for p in pauses if p.encode() in r.body)
        assert set(announced.values()) == {1}, announced
        desk.close()


def _quietly(desk: httpx.Client, run: str, checkpoint_id: str) -> None:
    """Approve; the answer never comes when the replica is killed."""
    try:
        with httpx.Client(base_url=str(desk.base_url), timeout=60, cookies=desk.cookies) as one:
            decide(one, run, checkpoint_id, approver="Ann")
    except httpx.HTTPError:
        pass
