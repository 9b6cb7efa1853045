"""Every run the demo writes, resumed for real: the page's prediction against what the SDK did.

For each run on each backend, a fresh copy of the store is taken, the rules say
what a resume or an approval would do (``localui.runs.resume_plan``), then the
runner that owns the run is called through the SDK directly, as the page's
button would, with every model call and tool call noted in order. The first
thing the SDK did and how the run ended must be what was predicted. A refusal
must be one the SDK deserves, and the app must refuse it before any row is
claimed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    BASE_URL,
    LOOPBACK_CLIENT,
    NO_SIGN_IN,
    PgRaw,
    backup,
    copy_pg_store,
    pg_name,
)
from starlette.testclient import TestClient

from localui import runs
from localui.app import create_app
from localui.backends.base import Backend, Store
from localui.demo import teams
from localui.demo.agent import build_agent
from localui.demo.scenarios import ALL_SCENARIOS, SeedReport, seed
from localui.records import RunQuery
from localui.settings import Settings

#: Also run on the lowest SDK the project declares (scripts/test.sh).
pytestmark = pytest.mark.floor

NAMES = tuple(s.name for s in ALL_SCENARIOS)

#: What each node of the demo chains does first: a tool node runs its tool, the parcel
#: chain's agent node (its courier) asks its model.
CHAIN_NODE_FIRST = {
    (teams.CHAIN_NAME, "step_1_lookup"): f"tool:{teams.CHAIN_NAME}:lookup_order",
    (teams.CHAIN_NAME, "step_2_plan"): f"tool:{teams.CHAIN_NAME}:plan_refund",
    (teams.CHAIN_NAME, "step_3_refund"): f"tool:{teams.CHAIN_NAME}:refund",
    (teams.CHAIN_NAME, "step_4_notify"): f"tool:{teams.CHAIN_NAME}:notify_customer",
    (teams.PARCEL_CHAIN_NAME, "step_1_lookup"): f"tool:{teams.PARCEL_CHAIN_NAME}:lookup_parcel",
    (teams.PARCEL_CHAIN_NAME, "step_2_collect"): f"model:{teams.COURIER_NAME}",
}

#: A crash inside the refund re-runs the refund, which asks a manager again.
ENDS_PAUSED = frozenset({"chain-crashed", "supervisor-crashed", "swarm-crashed"})


@dataclass(frozen=True, slots=True)
class Seeds:
    sqlite: SeedReport
    pg_dsn: str
    pg_schema: str
    pg: SeedReport


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str) -> Iterator[Seeds]:
    """Every demo scenario, refund-bot and the other shapes, on both backends."""
    schema = pg_name("fastaiagent_shapes")
    try:
        yield Seeds(
            sqlite=seed(tmp_path_factory.mktemp("shapes") / "local.db", scenarios=ALL_SCENARIOS),
            pg_dsn=pg_dsn,
            pg_schema=schema,
            pg=seed(pg_dsn, pg_schema=schema, scenarios=ALL_SCENARIOS),
        )
    finally:
        PgRaw(pg_dsn, schema).drop()


@dataclass
class Copy:
    """A test's own copy of the seeded store, its backend and the SDK's checkpointer."""

    settings: Settings
    backend: Backend
    checkpointer: Any
    report: SeedReport

    @property
    def store(self) -> Store:
        return self.backend.store


@pytest.fixture(params=("sqlite", "postgres"))
def copy(request: pytest.FixtureRequest, seeds: Seeds, tmp_path: Path) -> Iterator[Copy]:
    with ExitStack() as stack:
        if request.param == "sqlite":
            from fastaiagent.checkpointers import SQLiteCheckpointer

            from localui.backends.sqlite import SQLiteBackend

            path = backup(Path(seeds.sqlite.store), tmp_path / "copy.db")
            settings = Settings(store=str(path), sign_in=NO_SIGN_IN)
            backend: Backend = SQLiteBackend(path)
            checkpointer: Any = SQLiteCheckpointer(str(path))
            report = seeds.sqlite
        else:
            from fastaiagent.checkpointers.postgres import PostgresCheckpointer

            from localui.backends.postgres import PostgresBackend

            schema, app_schema = pg_name("fastaiagent"), pg_name("localui")
            copy_pg_store(seeds.pg_dsn, seeds.pg_schema, seeds.pg_dsn, schema)
            stack.callback(PgRaw(seeds.pg_dsn, schema).drop)
            stack.callback(PgRaw(seeds.pg_dsn, app_schema).drop)
            settings = Settings(
                store=seeds.pg_dsn,
                pg_schema=schema,
                pg_app_schema=app_schema,
                sign_in=NO_SIGN_IN,
            )
            backend = PostgresBackend(seeds.pg_dsn, schema=schema, app_schema=app_schema)
            checkpointer = PostgresCheckpointer(seeds.pg_dsn, schema=schema)
            report = seeds.pg
        stack.callback(backend.close)
        stack.callback(checkpointer.close)
        yield Copy(settings, backend, checkpointer, report)


def runners(checkpointer: Any, events: list[str]) -> dict[str, Any]:
    """Every demo runner, switches off, noting what it does into ``events``."""
    made: list[Any] = [
        build_agent(checkpointer, events=events),
        teams.build_chain(checkpointer, events=events),
        teams.build_parcel_chain(checkpointer, events=events),
        teams.build_supervisor(checkpointer, events=events),
        teams.build_swarm(checkpointer, events=events),
        teams.build_long_agent(checkpointer, events=events),
    ]
    return {r.name: r for r in made}


def chain_order(owner: runs.Owner, registered: dict[str, Any]) -> tuple[str, ...] | None:
    if owner.kind != runs.CHAIN:
        return None
    from fastaiagent.chain.executor import _topological_sort

    chain = registered[owner.name]
    return tuple(_topological_sort(chain.nodes, chain.edges))


def expected_first_event(first: runs.FirstAct, owner: runs.Owner) -> str:
    if first.kind == "node":
        assert first.name is not None, "the chain is registered, so its node is known"
        return CHAIN_NODE_FIRST[(owner.name, first.name)]
    if first.kind == "tool":
        return f"tool:{first.agent}:{first.name}"
    assert first.agent is not None
    return f"model:{first.agent}"


def state_of(store: Store, execution_id: str) -> str:
    facts = store.get_run(execution_id)
    assert facts is not None
    return runs.state_of(facts)


@pytest.mark.postgres
@pytest.mark.parametrize("name", NAMES)
def test_the_sdk_does_first_what_the_page_predicts(copy: Copy, name: str) -> None:
    from fastaiagent import Resume
    from fastaiagent.chain.interrupt import AlreadyResumed

    execution_id = copy.report.run_id(name)
    rows = copy.store.list_rows(execution_id)
    state = state_of(copy.store, execution_id)
    events: list[str] = []
    registered = runners(copy.checkpointer, events)
    owner = runs.run_owner(rows)
    plan = runs.resume_plan(
        state, rows, backend=copy.backend.kind, chain_order=chain_order(owner, registered)
    )
    runner = registered[owner.name]
    answer = Resume(approved=True, metadata={"approver": "tests", "reason": "checking"})

    if isinstance(plan, runs.Refusal):
        if state == runs.PAUSED:
            # The refusal is earned: the SDK itself claims the pending row and fails.
            with pytest.raises(AlreadyResumed):
                asyncio.run(runner.aresume(execution_id, resume_value=answer))
            assert copy.store.get_pending(execution_id) is None, "the SDK lost the pause"
        else:
            with pytest.raises(Exception) as refused:
                asyncio.run(runner.aresume(execution_id))
            assert "already finished" in str(refused.value) or state == runs.ORPHANED
        assert events == [], f"{name}: the SDK ran {events} on a run it refused"
        return

    value = answer if state == runs.PAUSED else None
    result = asyncio.run(runner.aresume(execution_id, resume_value=value))

    assert events, f"{name}: the resume did nothing"
    assert events[0] == expected_first_event(plan.first, owner), (name, plan, events[:5])
    ended = runs.PAUSED if name in ENDS_PAUSED else runs.COMPLETED
    assert (result.status, state_of(copy.store, execution_id)) == (ended, ended), name
    if owner.kind == runs.SUPERVISOR:
        if ended == runs.COMPLETED:
            assert result.output == teams.SUPERVISOR_DONE
        # The worker re-entered where predicted: its paused or saved tool ran again.
        assert f"tool:{plan.member}:refund" in events
    if plan.note is not None and "fork's origin" in plan.note:
        # The fork finishes its source's conversation, not its own new request.
        assert "A-1001" in str(result.output) and "A-1010" not in str(result.output)


@pytest.mark.postgres
def test_long_runs_are_predicted_past_the_sdk_s_500_rows(copy: Copy) -> None:
    failed = copy.store.list_rows(copy.report.run_id("long-failed"))
    plan = runs.resume_plan(runs.FAILED, failed, backend=copy.backend.kind)
    assert isinstance(plan, runs.ResumePlan) and len(failed) > runs.SDK_LIST_LIMIT
    # Not the model call of the last turn: row 500 is a tool call of turn 45.
    assert (plan.node_id, plan.shape) == ("turn:45/tool:step", "tool")
    assert plan.note is not None and "first 500" in plan.note

    paused = copy.store.list_rows(copy.report.run_id("long-paused"))
    refusal = runs.resume_plan(runs.PAUSED, paused, backend=copy.backend.kind)
    assert isinstance(refusal, runs.Refusal)
    assert "lose this pause" in refusal.reason and "Nothing has been claimed" in refusal.reason


@pytest.mark.postgres
def test_the_failed_fork_re_enters_where_each_backend_sorts_it(copy: Copy) -> None:
    rows = copy.store.list_rows(copy.report.run_id("fork-failed"))
    plan = runs.resume_plan(runs.FAILED, rows, backend=copy.backend.kind)
    assert isinstance(plan, runs.ResumePlan)
    if copy.backend.kind == runs.SQLITE:
        # SQLite's list sorts by node_index, and the origin row carries its source's.
        assert plan.node_id == "__fork_origin__"
        assert plan.note is not None and "source run's conversation" in plan.note
    else:
        assert plan.node_id == "turn:0" and plan.note is None


def approve_through_the_app(copy: Copy, execution_id: str, agents: list[Any]) -> Any:
    app = create_app(copy.settings, agents=agents)
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        card = client.get(f"/approvals/{execution_id}.json").json()
        response = client.post(
            f"/approvals/{execution_id}/approve",
            data={
                "approver": "Ann Approver",
                "reason": "checking",
                "checkpoint_id": card["pending"]["checkpoint_id"],
            },
            headers={"Accept": "application/json"},
        )
        return card, response


@pytest.mark.postgres
def test_a_pause_the_sdk_would_lose_is_refused_before_anything_is_claimed(copy: Copy) -> None:
    execution_id = copy.report.run_id("long-paused")
    agents = list(runners(copy.checkpointer, []).values())
    card, response = approve_through_the_app(copy, execution_id, agents)

    assert "lose this pause" in (card["pending"]["problem"] or "")
    assert response.status_code in (403, 409, 422), response.text
    # The queue's card says it too, before anyone clicks: it reads the whole run only
    # for such a run, one past the SDK's 500 rows.
    app = create_app(copy.settings, agents=agents)
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        queue = client.get("/approvals.json").json()["approvals"]
        html = client.get("/approvals").text
    problems = {a["execution_id"]: a["problem"] for a in queue}
    assert "lose this pause" in (problems[execution_id] or "")
    assert [i for i, p in problems.items() if p and "lose this pause" in p] == [execution_id]
    assert "Cannot be decided here: Approving here would lose this pause" in html
    assert copy.store.get_pending(execution_id) is not None, "the pause was claimed"
    assert state_of(copy.store, execution_id) == runs.PAUSED


@pytest.mark.postgres
@pytest.mark.parametrize("name", ["supervisor-paused", "swarm-paused", "chain-paused"])
def test_the_desk_names_the_runner_to_register(copy: Copy, name: str) -> None:
    execution_id = copy.report.run_id(name)
    card, response = approve_through_the_app(copy, execution_id, [])
    owner = runs.run_owner(copy.store.list_rows(execution_id))

    assert owner.kind == name.split("-")[0]
    problem = card["pending"]["problem"] or ""
    assert owner.describe() in problem and "--agents" in problem
    assert response.status_code in (403, 409, 422)
    assert copy.store.get_pending(execution_id) is not None


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("name", "output"),
    [
        ("supervisor-paused", teams.SUPERVISOR_DONE),
        ("swarm-paused", "Refund handled: refunded 250.00 on B-7"),
        ("chain-paused", None),
    ],
)
def test_a_team_or_chain_pause_is_approved_through_its_owner(
    copy: Copy, name: str, output: str | None
) -> None:
    execution_id = copy.report.run_id(name)
    events: list[str] = []
    card, response = approve_through_the_app(
        copy, execution_id, list(runners(copy.checkpointer, events).values())
    )

    assert card["pending"]["problem"] is None
    assert response.status_code == 200, response.text
    outcome = response.json()
    assert (outcome["action"], outcome["status"]) == ("approve", "completed")
    if output is not None:
        assert outcome["output"] == output
    assert state_of(copy.store, execution_id) == runs.COMPLETED
    assert copy.store.get_pending(execution_id) is None


@pytest.mark.postgres
@pytest.mark.parametrize("name", ["chain-crashed", "supervisor-crashed", "swarm-crashed"])
def test_a_crashed_team_or_chain_is_resumed_through_its_owner(copy: Copy, name: str) -> None:
    execution_id = copy.report.run_id(name)
    events: list[str] = []
    before = {r.checkpoint_id for r in copy.store.list_rows(execution_id)}
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        page = client.get(f"/runs/{execution_id}.json").json()
        plan = page["resume"]
        response = client.post(
            f"/runs/{execution_id}/resume",
            data={"checkpoint_id": plan["checkpoint_id"], "actor": "Ops", "confirm": "yes"},
            headers={"Accept": "application/json"},
        )

    assert response.status_code == 200, response.text
    # The re-run refund asks a manager again: the run waits, through its owner.
    assert response.json()["status"] == "paused"
    assert state_of(copy.store, execution_id) == runs.PAUSED
    first = {
        "chain-crashed": f"tool:{teams.CHAIN_NAME}:refund",
        "supervisor-crashed": f"model:{teams.SUPERVISOR_NAME}",
        "swarm-crashed": "model:refunder",
    }
    assert events[0] == first[name]
    assert (
        page["resume"]["shape"]
        == {"chain": "node", "supervisor": "team", "swarm": "turn"}[name.split("-")[0]]
    )
    if name == "swarm-crashed":
        # Killed in its refund tool, the Swarm re-enters where its JSON says: the SDK's
        # first new row is the active agent's turn:0, not the tool row it died at.
        written = [r for r in copy.store.list_rows(execution_id) if r.checkpoint_id not in before]
        assert written[0].node_id == plan["node_id"] == "turn:0"
        assert written[0].agent_path == f"swarm:{teams.SWARM_NAME}/agent:refunder"


def test_the_runs_list_names_each_run_by_its_owner(copy: Copy) -> None:
    """A team's run is listed under its Supervisor or Swarm, as its page says, not under
    the member whose row is newest; the agent filter finds each run by that name."""
    listed = copy.store.list_runs(RunQuery(limit=500)).runs
    owners = {f.execution_id: runs.run_owner(copy.store.list_rows(f.execution_id)) for f in listed}
    assert {f.execution_id: f.agent for f in listed} == {e: o.name for e, o in owners.items()}
    kinds = {o.kind for o in owners.values()}
    assert {runs.SUPERVISOR, runs.SWARM, runs.AGENT, runs.CHAIN} <= kinds
    for name in {o.name for o in owners.values()}:
        found = copy.store.list_runs(RunQuery(agent=name, limit=500)).runs
        assert {f.execution_id for f in found} == {e for e, o in owners.items() if o.name == name}
        for f in found:
            assert copy.store.get_run(f.execution_id) == f


def test_a_chain_s_card_names_its_paused_node_not_an_empty_call(copy: Copy) -> None:
    """What paused in a chain is a node, not a tool call: the card names the node and
    says the chain runs it again from its start, whichever way it is decided."""
    execution_id = copy.report.run_id("chain-paused")
    app = create_app(copy.settings)
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        pending = client.get(f"/approvals/{execution_id}.json").json()["pending"]
        html = client.get("/approvals").text
    node = pending["node_id"]
    assert pending["effects"]["call"] is None and pending["effects"]["tool"] == ""
    start = html.index(f'id="approval-{execution_id}"')
    card = html[start : html.index("</article>", start)]
    assert f"<code>{node}</code></h2>" in card and "()" not in card
    assert f"the node <code>{node}</code> runs again from its start with the answer" in card
    assert "then the chain goes on" in card and "what it does then is the chain's code" in card


@pytest.mark.parametrize(
    ("name", "approve"),
    [
        (
            "supervisor-paused",
            "runs its planner again from the original request (a new model call); when it"
            " delegates to the worker, <code>refund</code> runs again with the answer",
        ),
        ("swarm-paused", "<code>refund</code> runs again with the answer <code>approved=true"),
    ],
)
def test_a_team_s_card_says_what_its_resume_does(copy: Copy, name: str, approve: str) -> None:
    """A Supervisor runs its planner again before its worker re-invokes the paused tool;
    a Swarm's active agent re-invokes it: each card says so, as the run page does."""
    execution_id = copy.report.run_id(name)
    with TestClient(create_app(copy.settings), base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        html = client.get("/approvals").text
    start = html.index(f'id="approval-{execution_id}"')
    card = html[start : html.index("</article>", start)]
    assert approve in card
    team = "team" if name.startswith("supervisor") else "swarm"
    assert f"then the {team} goes on" in card and "then the agent goes on" not in card


# --- an agent used as a tool, under an execution id of its own ----------------------------

FRONT_DESK = "front-desk"


def build_front_desk(
    checkpointer: Any, refund_bot: Any, events: list[str], *, same_execution: bool = False
) -> Any:
    """An agent whose one tool hands the request to ``refund_bot``: as a run of its own
    (``refund_bot.arun`` inside the tool makes a new execution id, and its rows carry
    ``agent:front-desk/agent:refund-bot`` though front-desk writes none of them), or,
    ``same_execution``, inside front-desk's own run (under the id the SDK keeps for the
    running execution)."""
    from fastaiagent import Agent, tool
    from fastaiagent.llm.message import MessageRole
    from fastaiagent.testing import FunctionModel

    @tool(name="ask_refund_bot", register=False)
    async def ask_refund_bot(request: str) -> str:
        """Hand a refund request to refund-bot."""
        events.append(f"tool:{FRONT_DESK}:ask_refund_bot")
        if same_execution:
            from fastaiagent.chain.interrupt import _execution_id

            result = await refund_bot.arun(request, execution_id=_execution_id.get())
        else:
            result = await refund_bot.arun(request)
        return f"refund-bot answered: {result.status}"

    def answer(messages: list[Any]) -> Any:
        events.append(f"model:{FRONT_DESK}")
        if messages and messages[-1].role == MessageRole.tool:
            return "Handed over to refund-bot."
        request = next(str(m.content) for m in reversed(messages) if m.role == MessageRole.user)
        return "", [
            {"id": "call_0_ask", "name": "ask_refund_bot", "arguments": {"request": request}}
        ]

    return Agent(
        name=FRONT_DESK,
        llm=FunctionModel(answer, model="front-desk-demo"),
        tools=[ask_refund_bot],
        checkpointer=checkpointer,
    )


@pytest.mark.postgres
def test_an_agent_used_as_a_tool_owns_its_own_execution(copy: Copy) -> None:
    """The pause is refund-bot's, listed and decided as refund-bot's: approving it
    continues refund-bot (``refund_bot.aresume``), which writes its rows as refund-bot,
    where resuming with front-desk would answer with front-desk's own conversation."""
    events: list[str] = []
    refund_bot = build_agent(copy.checkpointer, events=events)
    desk = build_front_desk(copy.checkpointer, refund_bot, events)
    outer = asyncio.run(desk.arun("Refund order A-1002 for 250.00"))
    assert outer.status == "completed"
    nested = [
        f
        for f in copy.store.list_runs(RunQuery(limit=500)).runs
        if f.execution_id != outer.execution_id
        and any(
            r.agent_path == f"agent:{FRONT_DESK}/agent:refund-bot"
            for r in copy.store.list_rows(f.execution_id)
        )
    ]
    assert len(nested) == 1
    helper_run = nested[0].execution_id
    rows = copy.store.list_rows(helper_run)
    assert {r.agent for r in rows} == {"refund-bot"}, "front-desk wrote no row of it"

    # The rule, the runs index (both backends) and the queue all name refund-bot.
    assert runs.run_owner(rows) == runs.Owner(runs.AGENT, "refund-bot")
    assert nested[0].agent == "refund-bot"
    assert copy.store.get_run(outer.execution_id).agent == FRONT_DESK  # type: ignore[union-attr]
    plan = runs.resume_plan(runs.PAUSED, rows, backend=copy.backend.kind)
    assert isinstance(plan, runs.ResumePlan) and plan.owner.name == "refund-bot"

    events.clear()
    card, response = approve_through_the_app(copy, helper_run, [refund_bot, desk])
    assert card["pending"]["runner"] == "Agent 'refund-bot'"
    assert card["pending"]["problem"] is None
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"
    # What the SDK did: refund-bot's paused tool again, then refund-bot's model.
    assert events[:2] == ["tool:refund-bot:refund", "model:refund-bot"]
    assert not any(e.startswith(f"model:{FRONT_DESK}") for e in events)
    after = copy.store.list_rows(helper_run)
    assert {r.agent for r in after} == {"refund-bot"}
    assert state_of(copy.store, helper_run) == runs.COMPLETED
    assert copy.store.get_run(helper_run).agent == "refund-bot"  # type: ignore[union-attr]


@pytest.mark.postgres
def test_an_agent_run_inside_another_agents_execution_is_the_outer_ones(copy: Copy) -> None:
    """The same nesting of paths in one execution: front-desk wrote rows of it (and its
    end), so the run stays front-desk's, in the rule and in the runs index."""
    events: list[str] = []
    refund_bot = build_agent(copy.checkpointer, events=events)
    desk = build_front_desk(copy.checkpointer, refund_bot, events, same_execution=True)
    outer = asyncio.run(desk.arun("Refund order A-1001 for 40.00"))
    assert outer.status == "completed"
    rows = copy.store.list_rows(outer.execution_id)
    assert {r.agent_path for r in rows} >= {
        f"agent:{FRONT_DESK}",
        f"agent:{FRONT_DESK}/agent:refund-bot",
    }
    assert runs.run_owner(rows) == runs.Owner(runs.AGENT, FRONT_DESK)
    assert copy.store.get_run(outer.execution_id).agent == FRONT_DESK  # type: ignore[union-attr]
    assert state_of(copy.store, outer.execution_id) == runs.COMPLETED


#: A child process that starts a refund-bot run asking for two tools in one turn and
#: dies as the first (``refund``) starts: argv is the backend, where, and the run's id.
DIE_IN_FIRST_OF_TWO = """
import asyncio, sys
from localui.demo.agent import build_agent
backend, where, schema, execution_id = sys.argv[1:5]
if backend == "sqlite":
    from fastaiagent.checkpointers import SQLiteCheckpointer
    checkpointer = SQLiteCheckpointer(where)
else:
    from fastaiagent.checkpointers.postgres import PostgresCheckpointer
    checkpointer = PostgresCheckpointer(where, schema=schema)
agent = build_agent(checkpointer, die_in_tool=True)
asyncio.run(agent.arun("Refund order A-1011 for 80.00 and notify the customer",
                       execution_id=execution_id))
"""


def test_a_resume_inside_the_first_of_two_calls_says_the_second_is_not_run(
    copy: Copy, tmp_path: Path
) -> None:
    """The model asked for ``refund`` and ``notify_customer`` in one turn, and the process
    died in ``refund``: a resume re-invokes ``refund`` only, and the SDK answers
    ``notify_customer`` "not run on resume". The page says so before anyone clicks."""
    import os
    import subprocess
    import sys
    import uuid

    from localui.demo.agent import EXIT_DIED_IN_TOOL

    execution_id = f"two-calls-{uuid.uuid4().hex[:8]}"
    where = copy.settings.store
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    died = subprocess.run(
        [
            sys.executable,
            "-c",
            DIE_IN_FIRST_OF_TWO,
            copy.backend.kind,
            where,
            copy.settings.pg_schema,
            execution_id,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert died.returncode == EXIT_DIED_IN_TOOL, died.stderr
    events: list[str] = []
    # Stalled at once, so /attention lists it beside the others.
    settings = dataclasses.replace(copy.settings, stale_after=0.0)
    app = create_app(settings, agents=list(runners(copy.checkpointer, events).values()))
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        page = client.get(f"/runs/{execution_id}.json").json()
        said = page["verdict"]["resume"]
        assert "Resume re-invokes `refund`" in said
        assert "The other call of that turn, `notify_customer`, is not run" in said
        listed = client.get("/attention.json").json()["runs"]
        [row] = [r for r in listed if r["execution_id"] == execution_id]
        assert "The other call of that turn, `notify_customer`, is not run" in row["resume"]
        response = client.post(
            f"/runs/{execution_id}/resume",
            data={
                "checkpoint_id": page["resume"]["checkpoint_id"],
                "actor": "Ops",
                "confirm": "yes",
            },
            headers={"Accept": "application/json"},
        )
    assert response.status_code == 200, response.text
    # What the SDK did is what the page said: refund ran again, notify_customer never.
    assert "tool:refund-bot:refund" in events
    assert "tool:refund-bot:notify_customer" not in events


# --- what a fork would do ---------------------------------------------------------

#: (scenario, the row forked from, a new input): an agent's model row, its tool row, its
#: pause, a fresh conversation, and a chain's first node.
FORKS = (
    ("idempotent-resumed", "turn:0", None),
    ("idempotent-resumed", "turn:0/tool:refund", None),
    ("paused-1", "turn:0/tool:refund", None),
    ("completed", "turn:0", "Refund order A-1003 for 30.00"),
    ("two-tools-first-pauses", "turn:0", None),
    ("chain-paused", "step_1_lookup", None),
)


def every_row(store: Store, execution_id: str) -> list[tuple[Any, ...]]:
    """A run's rows with their payloads, to hold a source run to byte for byte."""
    rows = store.list_rows(execution_id)
    details = store.get_rows([r.checkpoint_id for r in rows])
    return [(r, details[r.checkpoint_id].raw if r.checkpoint_id in details else None) for r in rows]


@pytest.mark.postgres
@pytest.mark.parametrize(("name", "node_id", "new_input"), FORKS)
def test_a_fork_does_what_its_preview_says(
    copy: Copy, name: str, node_id: str, new_input: str | None
) -> None:
    execution_id = copy.report.run_id(name)
    rows = copy.store.list_rows(execution_id)
    row = next(r for r in rows if r.node_id == node_id and r.status != "interrupted")
    if node_id == "turn:0/tool:refund" and name == "paused-1":
        row = next(r for r in rows if r.node_id == node_id and r.status == "interrupted")
    events: list[str] = []
    registered = runners(copy.checkpointer, events)
    app = create_app(copy.settings, agents=list(registered.values()))
    query: dict[str, str] = {"checkpoint_id": row.checkpoint_id}
    if new_input:
        query["input"] = new_input
    before = every_row(copy.store, execution_id)
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        preview = client.get(f"/runs/{execution_id}/fork.json", params=query)
        page = client.get(f"/runs/{execution_id}/fork", params=query)
    assert preview.status_code == 200, preview.text
    said = preview.json()
    assert page.status_code == 200 and "What a fork from" in page.text
    # A GET changes nothing.
    assert every_row(copy.store, execution_id) == before

    owner = runs.run_owner(rows)
    runner = registered[owner.name]
    result = asyncio.run(
        runner.afork(execution_id, checkpoint_id=row.checkpoint_id, input=new_input)
    )
    branch = result.execution_id
    assert every_row(copy.store, execution_id) == before, "the source run changed"

    model_calls = [e for e in events if e.startswith("model:")]
    tools_run = [e.rsplit(":", 1)[1] for e in events if e.startswith("tool:")]
    assert said["model_called_again"] == bool(model_calls), (said, events)
    assert said["conversation"] == ("fresh" if new_input else "continued")
    assert said["cached_reused"] == 0
    # The tools the branch ran are those the preview listed, in order (the demo's model
    # decides from the conversation alone, as the original's did).
    assert [t["tool"] for t in said["tools_again"]] == tools_run, (said, events)
    if owner.kind == runs.AGENT and not new_input:
        source_calls = {
            r.checkpoint_id: copy.store.get_row(r.checkpoint_id) for r in rows if r.node_id
        }
        for call in said["tools_again"]:
            detail = source_calls[call["checkpoint_id"]]
            assert detail is not None and call["arguments"] == detail.node_input
        # The model really went on from the row's conversation: the branch's first model
        # row holds the row's messages, then the SDK's note for each call it did not run.
        base = copy.store.get_row(row.checkpoint_id)
        assert base is not None
        first = next(r for r in copy.store.list_rows(branch) if r.step_type == "llm_call")
        first_detail = copy.store.get_row(first.checkpoint_id)
        assert first_detail is not None
        sent = first_detail.state_snapshot["messages"]
        kept = base.state_snapshot["messages"]
        assert sent[: len(kept)] == kept
        notes = [m for m in sent[len(kept) :] if m.get("role") == "tool"]
        assert len(notes) == len(said["not_run"])
        assert all("the conversation was branched before its result" in str(m) for m in notes)
    if new_input:
        first = next(r for r in copy.store.list_rows(branch) if r.step_type == "llm_call")
        first_detail = copy.store.get_row(first.checkpoint_id)
        assert first_detail is not None
        users = [m for m in first_detail.state_snapshot["messages"] if m.get("role") == "user"]
        assert [m["content"] for m in users] == [new_input], "not a fresh conversation"
    # No cached result is reused: every side effect the branch reached ran and cached anew.
    if tools_run and any(t["cached_in_source"] for t in said["tools_again"]):
        assert copy.store.list_cache(branch), "the branch's side effect did not run again"
    # Where the original paused after the row, a branch that got there paused too.
    if said["pauses_ahead"] and tools_run:
        assert result.status == "paused", (said, result.status)
    else:
        assert result.status != "paused"


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("name", "node_id", "status", "why"),
    [
        ("completed", "run_end", 422, "run-end marker"),
        ("supervisor-paused", "turn:0", 422, "no fork for a supervisor run"),
        ("chain-paused", "step_4_notify", 404, "has no row"),
    ],
)
def test_a_fork_preview_refuses_what_the_fork_would_refuse(
    copy: Copy, name: str, node_id: str, status: int, why: str
) -> None:
    execution_id = copy.report.run_id(name)
    rows = copy.store.list_rows(execution_id)
    checkpoint_id = next((r.checkpoint_id for r in rows if r.node_id == node_id), "nope")
    events: list[str] = []
    app = create_app(copy.settings, agents=list(runners(copy.checkpointer, events).values()))
    with TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client:
        answer = client.get(
            f"/runs/{execution_id}/fork.json", params={"checkpoint_id": checkpoint_id}
        )
        missing = client.get("/runs/no-such-run/fork.json")
    assert answer.status_code == status, answer.text
    assert why in answer.json()["error"]["message"]
    assert missing.status_code == 404
    assert events == []
