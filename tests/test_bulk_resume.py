"""Bulk resume after an outage: every runner shape the SDK writes ends as its single
resume would, on both backends; two processes given the same picks resume each run
once; roles and cross-site requests are refused.

Twin copies of one seeded store (every scenario, every runner shape, written by the
real SDK in child processes whose crashes are real ``os._exit`` deaths): one is
resumed in bulk, the other a run at a time through ``/runs/{id}/resume``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import BASE_URL, Ledger, PgRaw, backup, copy_pg_store, pg_name
from helpers import JSON, LOOPBACK_CLIENT, NO_SIGN_IN, LocalServer, all_at_once, start_localui
from starlette.testclient import TestClient

from localui import runs
from localui.app import create_app
from localui.backends.base import Backend
from localui.demo import teams
from localui.demo.agent import build_agent
from localui.demo.scenarios import ALL_SCENARIOS, SeedReport, seed
from localui.settings import Settings

#: A crash or failure of each runner shape the SDK writes.
PICKED = (
    "crashed-in-tool",
    "crashed-waiting-on-model",
    "failed",
    "chain-crashed",
    "supervisor-crashed",
    "swarm-crashed",
    "long-failed",
)
#: Seeded for these tests: the picks, each shape's runner writing its own.
SCENARIOS = tuple(s for s in ALL_SCENARIOS if s.name in PICKED)


@dataclass(frozen=True, slots=True)
class Seeds:
    sqlite: SeedReport
    pg_dsn: str
    pg_schema: str
    pg: SeedReport


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str) -> Iterator[Seeds]:
    schema = pg_name("fastaiagent_bulk")
    try:
        yield Seeds(
            sqlite=seed(tmp_path_factory.mktemp("bulk") / "local.db", scenarios=SCENARIOS),
            pg_dsn=pg_dsn,
            pg_schema=schema,
            pg=seed(pg_dsn, pg_schema=schema, scenarios=SCENARIOS),
        )
    finally:
        PgRaw(pg_dsn, schema).drop()


@dataclass
class Twin:
    """One copy of the seeded store: settings to serve it, its SDK checkpointer."""

    settings: Settings
    checkpointer: Any
    backend: Backend
    #: ``--store`` (and schemas) as ``localui serve`` takes them.
    serve_args: list[str]
    #: The agents-file line that builds this copy's checkpointer.
    checkpointer_code: str


def make_twin(kind: str, seeds: Seeds, where: Path, stack: ExitStack) -> Twin:
    if kind == "sqlite":
        from fastaiagent.checkpointers import SQLiteCheckpointer

        from localui.backends.sqlite import SQLiteBackend

        path = backup(Path(seeds.sqlite.store), where / "local.db")
        checkpointer: Any = SQLiteCheckpointer(str(path))
        twin = Twin(
            Settings(store=str(path), sign_in=NO_SIGN_IN),
            checkpointer,
            SQLiteBackend(path),
            ["--store", str(path)],
            f"SQLiteCheckpointer({str(path)!r})",
        )
    else:
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        from localui.backends.postgres import PostgresBackend

        schema, app_schema = pg_name("fastaiagent"), pg_name("localui")
        copy_pg_store(seeds.pg_dsn, seeds.pg_schema, seeds.pg_dsn, schema)
        stack.callback(PgRaw(seeds.pg_dsn, schema).drop)
        stack.callback(PgRaw(seeds.pg_dsn, app_schema).drop)
        checkpointer = PostgresCheckpointer(seeds.pg_dsn, schema=schema)
        twin = Twin(
            Settings(
                store=seeds.pg_dsn, pg_schema=schema, pg_app_schema=app_schema, sign_in=NO_SIGN_IN
            ),
            checkpointer,
            PostgresBackend(seeds.pg_dsn, schema=schema, app_schema=app_schema),
            ["--store", seeds.pg_dsn, "--pg-schema", schema, "--pg-app-schema", app_schema],
            f"PostgresCheckpointer({seeds.pg_dsn!r}, schema={schema!r})",
        )
    stack.callback(twin.backend.close)
    stack.callback(checkpointer.close)
    return twin


def runners(checkpointer: Any, ledger: Ledger) -> list[Any]:
    return [
        build_agent(checkpointer, ledger=ledger.path),
        teams.build_chain(checkpointer),
        teams.build_supervisor(checkpointer),
        teams.build_swarm(checkpointer),
        teams.build_long_agent(checkpointer),
    ]


def client_of(twin: Twin, ledger: Ledger, stack: ExitStack, **settings: Any) -> TestClient:
    values = {
        "store": twin.settings.store,
        "pg_schema": twin.settings.pg_schema,
        "pg_app_schema": twin.settings.pg_app_schema,
        "sign_in": NO_SIGN_IN,
        **settings,
    }
    app = create_app(Settings(**values), agents=runners(twin.checkpointer, ledger))
    return stack.enter_context(TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT))


def state_of(twin: Twin, execution_id: str) -> str:
    facts = twin.backend.store.get_run(execution_id)
    assert facts is not None
    return runs.run_state(facts.last_step_type, facts.last_status, facts.has_pending)


def pick_of(client: TestClient, execution_id: str) -> str:
    plan = client.get(f"/runs/{execution_id}.json").json()["resume"]
    return json.dumps([execution_id, plan["checkpoint_id"]])


def node_path(twin: Twin, execution_id: str) -> list[tuple[str, str | None]]:
    return [(r.node_id, r.step_type) for r in twin.backend.store.list_rows(execution_id)]


@pytest.mark.postgres
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_bulk_resume_of_every_shape_ends_as_the_single_resume_would(
    kind: str, seeds: Seeds, tmp_path: Path
) -> None:
    report = seeds.sqlite if kind == "sqlite" else seeds.pg
    ids = [report.run_id(name) for name in PICKED]
    with ExitStack() as stack:
        (tmp_path / "bulk").mkdir()
        (tmp_path / "single").mkdir()
        bulk, single = (make_twin(kind, seeds, tmp_path / n, stack) for n in ("bulk", "single"))
        bulk_ledger, single_ledger = Ledger(tmp_path / "bulk.jsonl"), Ledger(tmp_path / "s.jsonl")
        bulk_client = client_of(bulk, bulk_ledger, stack)
        single_client = client_of(single, single_ledger, stack)

        picks = [pick_of(bulk_client, e) for e in ids]
        response = bulk_client.post(
            "/runs/bulk-resume", data={"pick": picks, "confirm": "yes"}, headers=JSON
        )
        assert response.status_code == 200, response.text
        answer = response.json()
        one_by_one = {}
        for execution_id in ids:
            _, checkpoint_id = json.loads(pick_of(single_client, execution_id))
            resumed = single_client.post(
                f"/runs/{execution_id}/resume",
                data={"checkpoint_id": checkpoint_id, "confirm": "yes"},
                headers=JSON,
            )
            assert resumed.status_code == 200, resumed.text
            one_by_one[execution_id] = resumed.json()["status"]

        assert [p["execution_id"] for p in answer["preflight"]] == ids
        by_run = {item["execution_id"]: item for item in answer["items"]}
        assert set(by_run) == set(ids)
        for execution_id in ids:
            item = by_run[execution_id]
            assert item["result"] == "resumed", item
            assert item["status"] == one_by_one[execution_id], execution_id
            assert state_of(bulk, execution_id) == state_of(single, execution_id)
            assert node_path(bulk, execution_id) == node_path(single, execution_id)
        assert answer["counts"]["resumed"] == len(ids)
        assert sorted(map(json.dumps, bulk_ledger.effects())) == sorted(
            map(json.dumps, single_ledger.effects())
        )

        # The same picks again resume nothing: each claim was taken.
        again = bulk_client.post(
            "/runs/bulk-resume", data={"pick": picks, "confirm": "yes"}, headers=JSON
        ).json()
        assert {i["result"] for i in again["items"]} <= {"already_resumed", "stale", "refused"}
        assert again["counts"]["resumed"] == 0
        assert len(bulk_ledger.effects()) == len(single_ledger.effects())


def crash_now(store: Path) -> str:
    """The demo agent in a child process of its own dies inside its refund tool now."""
    from localui.demo.agent import EXIT_DIED_IN_TOOL

    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false", "FASTAIAGENT_LOCAL_DB": str(store)}
    done = subprocess.run(
        [sys.executable, "-m", "localui.demo.worker", "--store", str(store)]
        + ["--scenario", "crashed-in-tool"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_DIED_IN_TOOL, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_the_page_lists_what_each_run_would_do_before_the_outcomes(
    seeds: Seeds, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        twin = make_twin("sqlite", seeds, tmp_path, stack)
        # A run whose process died a moment ago: its newest row is seconds old.
        fresh = crash_now(Path(twin.settings.store))
        ids = [seeds.sqlite.run_id("crashed-waiting-on-model"), fresh]
        ledger = Ledger(tmp_path / "ledger.jsonl")
        client = client_of(twin, ledger, stack, stale_after=0.0)
        listed = client.get("/attention.json").json()["runs"]
        shown = next(r for r in listed if r["execution_id"] == fresh)
        # Shown before any tick: the refund would run again with no cached result, and
        # the run may still be alive.
        assert (shown["repeats"], shown["needs_confirm"]) == ("refund", True)
        picks = [pick_of(client, e) for e in ids]

        unconfirmed = client.post("/runs/bulk-resume", data={"pick": picks[1:]}).text
        fresh_state = state_of(twin, fresh)
        html = client.post("/runs/bulk-resume", data={"pick": picks, "confirm": "yes"}).text
        states = [state_of(twin, e) for e in ids]

    # Without confirm the seconds-old run is refused, said so, and left as it was.
    assert unconfirmed.count('class="bulk-needs_confirmation"') == 1
    assert fresh_state == runs.UNFINISHED
    preflight, _, outcomes = html.partition("As each finishes")
    assert "1 run will run a tool again that no cached result answers" in preflight
    assert "repeats <code>refund</code>, not cached" in preflight
    assert "resumed" not in preflight
    assert outcomes.count('class="bulk-resumed"') == 2
    assert "2 done:</strong> 2 resumed" in outcomes
    assert states == [runs.COMPLETED, runs.COMPLETED]
    assert ledger.count("charge_back") == 1
    # The nav's badges carry numbers, as on every other page.
    badges = re.findall(r'id="nav-(?:pending|attention)"[^>]*>([^<]*)<', html)
    assert len(badges) == 2 and all(b.strip().isdigit() for b in badges), badges


AGENTS_FILE = """\
from pathlib import Path

from fastaiagent.checkpointers import SQLiteCheckpointer
from fastaiagent.checkpointers.postgres import PostgresCheckpointer

from localui.demo.agent import build_agent


def refund_bot():
    return build_agent({checkpointer}, ledger=Path({ledger!r}))
"""


@pytest.mark.postgres
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_processes_given_the_same_picks_resume_each_run_once(
    kind: str, seeds: Seeds, tmp_path: Path
) -> None:
    report = seeds.sqlite if kind == "sqlite" else seeds.pg
    ids = [report.run_id(n) for n in ("crashed-in-tool", "crashed-waiting-on-model", "failed")]
    ledger = Ledger(tmp_path / "ledger.jsonl")
    servers: list[LocalServer] = []
    with ExitStack() as stack:
        twin = make_twin(kind, seeds, tmp_path, stack)
        agents = tmp_path / "fleet_agents.py"
        agents.write_text(
            AGENTS_FILE.format(checkpointer=twin.checkpointer_code, ledger=str(ledger.path))
        )
        env = {
            **os.environ,
            "FASTAIAGENT_TRACE_ENABLED": "false",
            "FASTAIAGENT_LOCAL_DB": str(tmp_path / "sdk-local.db"),
        }
        try:
            for name in ("server-a", "server-b"):
                servers.append(
                    start_localui(
                        [
                            "serve",
                            *twin.serve_args,
                            "--agents",
                            f"{agents}:refund_bot",
                            "--no-auth",
                        ],
                        cwd=tmp_path,
                        log=tmp_path / f"{name}.log",
                        env=env,
                        ready="/approvals.json",
                        timeout=60,
                    )
                )
            with httpx.Client(base_url=servers[0].url, timeout=30) as first:
                picks = [
                    json.dumps([e, first.get(f"/runs/{e}.json").json()["resume"]["checkpoint_id"]])
                    for e in ids
                ]

            def bulk(i: int) -> httpx.Response:
                with httpx.Client(base_url=servers[i].url, timeout=120) as client:
                    return client.post(
                        "/runs/bulk-resume", data={"pick": picks, "confirm": "yes"}, headers=JSON
                    )

            answers = [r.json() for r in all_at_once(2, bulk)]
        finally:
            for server in servers:
                server.stop()

        resumed = [i for a in answers for i in a["items"] if i["result"] == "resumed"]
        assert sorted(i["execution_id"] for i in resumed) == sorted(ids)
        logs = "\n".join(
            f"--- {name}.log\n" + (tmp_path / f"{name}.log").read_text(errors="replace")[-4000:]
            for name in ("server-a", "server-b")
        )
        assert all(i["status"] == "completed" for i in resumed), (resumed, logs)
        for execution_id in ids:
            ends = [
                r.status
                for r in twin.backend.store.list_rows(execution_id)
                if r.step_type == "run_end"
            ]
            # The failed run had one end marker before; each run gains exactly one.
            assert len(ends) == (2 if execution_id == report.run_id("failed") else 1), (ends, logs)
        assert ledger.count("charge_back") == 2, ledger.effects()


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("approver", 403)])
def test_only_operators_resume_in_bulk(
    role: str, status: int, seeds: Seeds, tmp_path: Path
) -> None:
    from helpers import sign_in_settings

    from localui.backends import open_users
    from localui.backends.users import new_token, token_hash

    execution_id = seeds.sqlite.run_id("crashed-waiting-on-model")
    with ExitStack() as stack:
        twin = make_twin("sqlite", seeds, tmp_path, stack)
        users = open_users(twin.settings, writable=True)
        token = new_token()
        users.add(f"a-{role}", role, token_hash(token))
        users.close()
        client = client_of(twin, Ledger(tmp_path / "l.jsonl"), stack, sign_in=sign_in_settings())
        pick = json.dumps([execution_id, "any"])
        refused = client.post(
            "/runs/bulk-resume",
            data={"pick": [pick], "confirm": "yes"},
            headers={**JSON, "Authorization": f"Bearer {token}"},
        )
        cross_site = client.post(
            "/runs/bulk-resume",
            data={"pick": [pick], "confirm": "yes"},
            headers={"Sec-Fetch-Site": "cross-site", "Origin": "https://elsewhere.example"},
        )
        state = state_of(twin, execution_id)
    assert refused.status_code == status, refused.text
    assert cross_site.status_code == 403
    assert state == runs.UNFINISHED


def test_bad_picks_are_a_400_that_says_why(seeds: Seeds, tmp_path: Path) -> None:
    with ExitStack() as stack:
        twin = make_twin("sqlite", seeds, tmp_path, stack)
        client = client_of(twin, Ledger(tmp_path / "l.jsonl"), stack)
        none = client.post("/runs/bulk-resume", data={}, headers=JSON)
        bad = client.post("/runs/bulk-resume", data={"pick": ["not json"]}, headers=JSON)
    assert none.status_code == 400 and "pick at least one run" in none.text
    assert bad.status_code == 400 and re.search(r"pick=.*not json", bad.text)


def test_a_full_bulk_of_picks_gets_through_the_form(seeds: Seeds, tmp_path: Path) -> None:
    """As many picks as one bulk resume takes, with ``confirm`` beside them, are judged
    (the form parser's own cap of 1,000 fields would refuse them); one more is a 400
    that says the limit."""
    from localui.views.bulk_resume import BULK_RESUME_LIMIT

    with ExitStack() as stack:
        twin = make_twin("sqlite", seeds, tmp_path, stack)
        client = client_of(twin, Ledger(tmp_path / "l.jsonl"), stack)
        crashed = seeds.sqlite.run_id("crashed-in-tool")
        # The rest name runs the store does not hold: each is refused, none resumed.
        gone = [json.dumps([f"gone-{n}", f"row-{n}"]) for n in range(BULK_RESUME_LIMIT)]
        picks = [pick_of(client, crashed), *gone[: BULK_RESUME_LIMIT - 1]]
        full = client.post(
            "/runs/bulk-resume", data={"pick": picks, "confirm": "yes"}, headers=JSON
        )
        over = client.post(
            "/runs/bulk-resume", data={"pick": [*picks, gone[-1]], "confirm": "yes"}, headers=JSON
        )
        state = state_of(twin, crashed)
    assert full.status_code == 200, full.text[:500]
    answer = full.json()
    assert len(answer["items"]) == BULK_RESUME_LIMIT
    assert answer["counts"]["resumed"] == 1
    assert answer["counts"]["refused"] == BULK_RESUME_LIMIT - 1
    assert state == runs.COMPLETED
    assert over.status_code == 400 and f"at most {BULK_RESUME_LIMIT}" in over.text
