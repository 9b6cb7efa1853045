"""The team figures: two localui replicas on one PostgreSQL store behind HAProxy.

A team runs localui as several replicas behind a load balancer (README, "Run it for
a team"). Here two ``localui serve`` processes, sign-in on, share the store the
single-server measurements used, behind a real HAProxy (``bench.haproxy``), round
robin. Three things are measured:

- what the balancer and the second replica cost a page: the runs list and a run page,
  p50 through HAProxy over p50 on one replica directly, with the same session;
- how soon a run written by another process (``bench.fleet_writer --on-demand``, the
  SDK on its offline model) is on the runs list of each replica: the worst of a few
  runs, from the moment its writer had it in the store;
- how many people a replica's restart signs out: several people signed in through the
  balancer, one replica stopped and started again, each session asked of both.

The runs written are taken out of the store afterwards (``bench.fleet._take_out``).
The replicas keep their app tables (runs index, people, sessions' keys) in a schema of
their own, made for the figures and dropped after. The single-server figures before
them write runs and take them out again; in the index they share, those deletions
start a rebuild, and while a process's own rebuild runs its refresh catches up no new
run (``_bring_up_to_date`` in ``localui.backends.postgres.index.sync``), so a run
written then was not listed within the figure's 10 s.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import _take_out
from bench.haproxy import Balancer
from bench.latency import time_in_turns, warm_up
from bench.pg import drop_schema
from bench.servers import (
    INDEX_POLL_S,
    INDEX_TIMEOUT_S,
    REPO,
    PgTarget,
    Server,
    clean_env,
    free_port,
    pythonpath,
    start_localui,
)
from bench.stores import BuiltStore

Log = Callable[[str], None]

#: People signed in before a replica restarts.
PEOPLE = 5
#: Runs written while both replicas' runs lists are watched.
WRITES = 5
#: How often each replica's runs list is asked for a run just written.
POLL_S = 0.02
TOKEN = re.compile(r"\?token=(\S+)")


@dataclasses.dataclass
class TeamRun:
    figures: dict[str, float] = dataclasses.field(default_factory=dict)
    errors: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def _users_add(pg: PgTarget, name: str, app_path: Path | None) -> str:
    """A person added with ``localui users add``; their token."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "localui",
            "users",
            "add",
            name,
            "--role",
            "operator",
            "--store",
            pg.dsn,
            "--pg-app-schema",
            pg.app_schema,
        ],  # fmt: skip
        cwd=REPO,
        env=clean_env(PYTHONPATH=pythonpath(app_path)),
        capture_output=True,
        text=True,
        check=False,
    )
    found = TOKEN.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"localui users add {name}: {done.stderr.strip()}")
    return found.group(1)


def _session(base_url: str, token: str) -> str:
    """The ``Cookie`` header a sign-in link sets, through ``base_url``."""
    answer = httpx.get(f"{base_url}/?token={token}", follow_redirects=False, timeout=30)
    if answer.status_code != 303:
        raise RuntimeError(f"the sign-in link answered {answer.status_code}")
    return answer.headers["set-cookie"].partition(";")[0]


def _replica(
    store: BuiltStore, pg: PgTarget, port: int, app_path: Path | None
) -> tuple[Server, Path]:
    cache = Path(tempfile.mkdtemp(prefix="localui-bench-team-"))
    server = start_localui(
        store.path, cache_dir=cache, app_path=app_path, pg=pg, sign_in=True, port=port
    )
    return server, cache


def measure_team(
    store: BuiltStore,
    pg: PgTarget,
    *,
    requests: int,
    warmup: int,
    app_path: Path | None,
    log: Log,
) -> TeamRun:
    result = TeamRun()
    pg = dataclasses.replace(pg, app_schema=f"{pg.app_schema}_team")
    drop_schema(pg.dsn, pg.app_schema)
    ports = [free_port(), free_port()]
    replicas: list[Server] = []
    writer: subprocess.Popen[str] | None = None
    ids_file = Path(tempfile.mkdtemp(prefix="localui-bench-team-")) / "ids.txt"
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-haproxy-"))
    try:
        tokens = [
            _users_add(pg, f"bench-person-{i}-{os.getpid()}", app_path) for i in range(PEOPLE)
        ]
        replicas = [_replica(store, pg, port, app_path)[0] for port in ports]
        addresses = [(name, f"127.0.0.1:{p}") for name, p in zip("ab", ports, strict=True)]
        with Balancer(free_port(), addresses, workdir) as balancer:
            cookie = _session(balancer.url, tokens[0])
            headers = {"Cookie": cookie}
            # Pages are timed on a complete runs index (the single-server figures leave
            # one; a first start on the store builds it).
            _wait_indexed(replicas[0].base_url, headers)
            _pages(
                result,
                balancer.url,
                replicas[0].base_url,
                headers,
                requests,
                warmup,
                log,
                run=store.run_50,
            )
            writer = _writer(pg, app_path, ids_file)
            _seen(result, writer, [r.base_url for r in replicas], headers, log)
            _restart(result, balancer.url, replicas, ports, tokens, store, pg, app_path, log)
    except Exception as exc:
        result.errors.append(f"team: {type(exc).__name__}: {exc}")
    finally:
        if writer is not None:
            try:
                # Closes its standard input: the writer writes its ids and ends.
                writer.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                writer.kill()
                writer.wait()
        for server in replicas:
            server.stop()
        _take_out(pg, ids_file)
        drop_schema(pg.dsn, pg.app_schema)
    return result


def _wait_indexed(base_url: str, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + INDEX_TIMEOUT_S
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
        while client.get("/runs.json").json().get("indexing") is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the runs index was not ready within {INDEX_TIMEOUT_S:.0f} s")
            time.sleep(INDEX_POLL_S)


def _pages(
    result: TeamRun,
    through: str,
    direct: str,
    headers: dict[str, str],
    requests: int,
    warmup: int,
    log: Log,
    *,
    run: str,
) -> None:
    """The runs list and ``run``'s page (the store's 50-row run, as the single server's
    figures time: the newest run listed may be one an earlier figure wrote and took out
    again, which the index lists until its next full count)."""
    ratios = []
    for label, url in (("runs list", "/"), ("run page", f"/runs/{run}")):
        with (
            httpx.Client(base_url=direct, headers=headers, timeout=60) as one,
            httpx.Client(base_url=through, headers=headers, timeout=60) as balanced,
        ):
            for client in (one, balanced):
                error = warm_up(client, url, times=warmup)
                if error is not None:
                    raise RuntimeError(error)
            # In turns: whatever else the machine does falls on both alike.
            timings = time_in_turns(
                {"direct": (one, url), "haproxy": (balanced, url)}, requests=requests
            )
        if not all(t.ok for t in timings.values()):
            raise RuntimeError(f"{label}: {[t.error for t in timings.values()]}")
        ratio = timings["haproxy"].p50 / timings["direct"].p50
        ratios.append(ratio)
        log(
            f"  team, {label}: p50 {timings['haproxy'].p50:.1f} ms through HAProxy over two"
            f" replicas, {timings['direct'].p50:.1f} ms on one directly ({ratio:.2f}x)"
        )
        result.figures[f"team_{label.replace(' ', '_')}_ms"] = timings["haproxy"].p50
    result.figures["team_pages_ratio"] = max(ratios)


def _writer(pg: PgTarget, app_path: Path | None, ids_file: Path) -> subprocess.Popen[str]:
    said = ids_file.with_name("writer.log")
    writer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.fleet_writer",
            "--dsn",
            pg.dsn,
            "--schema",
            pg.schema,
            "--on-demand",
            "--ids",
            str(ids_file),
        ],  # fmt: skip
        cwd=REPO,
        env=clean_env(PYTHONPATH=pythonpath(app_path)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=said.open("w"),
        text=True,
    )
    assert writer.stdout is not None
    first = writer.stdout.readline().strip()
    if first != "writing":
        writer.wait(timeout=30)
        raise RuntimeError(f"the writer did not start: {first} {said.read_text()[-1500:]}")
    return writer


def _seen(
    result: TeamRun,
    writer: subprocess.Popen[str],
    replicas: list[str],
    headers: dict[str, str],
    log: Log,
) -> None:
    assert writer.stdin is not None and writer.stdout is not None
    clients = [httpx.Client(base_url=r, headers=headers, timeout=30) for r in replicas]
    worst = 0.0
    try:
        for _ in range(WRITES):
            writer.stdin.write("run\n")
            writer.stdin.flush()
            word, run, written = writer.stdout.readline().split()
            assert word == "written"
            for client in clients:
                deadline = time.time() + 10
                while run not in client.get("/runs.json").text:
                    if time.time() > deadline:
                        raise RuntimeError(f"{run} not on {client.base_url}'s runs list in 10 s")
                    time.sleep(POLL_S)
                worst = max(worst, time.time() - float(written))
    finally:
        for client in clients:
            client.close()
    result.figures["team_seen_s"] = worst
    log(f"  team: a run written elsewhere on both replicas' runs lists within {worst:.2f} s")


def _restart(
    result: TeamRun,
    through: str,
    replicas: list[Server],
    ports: list[int],
    tokens: list[str],
    store: BuiltStore,
    pg: PgTarget,
    app_path: Path | None,
    log: Log,
) -> None:
    cookies = [_session(through, token) for token in tokens]
    replicas[0].stop()
    replicas[0] = _replica(store, pg, ports[0], app_path)[0]
    signed_out = 0
    for cookie in cookies:
        answers: list[Any] = [
            httpx.get(f"{server.base_url}/runs.json", headers={"Cookie": cookie}, timeout=30)
            for server in replicas
        ]
        signed_out += any(a.status_code == 401 for a in answers)
    result.figures["team_signed_out"] = float(signed_out)
    log(f"  team: {signed_out} of {len(cookies)} people signed out by a replica's restart")
