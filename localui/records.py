"""What the store hands back: frozen records of rows as the SDK wrote them.

Records carry facts, never HTTP or presentation. JSON columns arrive parsed,
or as :class:`Unreadable` when the text in the store is not valid JSON, so a
corrupt row is something a page can show rather than an exception.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The SDK's node id and ``step_type`` of the row that opens a fork.
FORK_ORIGIN_NODE = "__fork_origin__"
FORK_ORIGIN_STEP = "fork_origin"
#: The SDK's ``step_type`` of the terminal row (``fastaiagent.chain.checkpoint.RUN_END``).
RUN_END_STEP = "run_end"
#: ``@idempotent`` results are stored as ``{"__fa_idem__": value}`` since SDK 1.92.
IDEMPOTENT_ENVELOPE = "__fa_idem__"


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A JSON column whose text could not be parsed; ``raw`` keeps a prefix of it."""

    error: str
    raw: str


#: Deeper JSON than this reads as :class:`Unreadable`: everything that walks a value
#: (JSON out, the diff, the pretty printer) recurses once or more per level, and
#: Python stops at a thousand frames. The SDK's own values are a few levels deep.
MAX_JSON_DEPTH = 300


def parse_json(text: str | None, default: Any) -> Any:
    """Parse a JSON column, turning damage into :class:`Unreadable` instead of raising."""
    if text is None or text == "":
        return default
    try:
        value = json.loads(text)
    except (ValueError, TypeError) as exc:
        return Unreadable(error=str(exc), raw=str(text)[:2000])
    except RecursionError:
        return _too_deep(text)
    # Only a text with that many brackets can nest that deep: the common case skips
    # the walk, and counting runs at C speed.
    if isinstance(text, str) and text.count("[") + text.count("{") > MAX_JSON_DEPTH:
        if json_depth(value) > MAX_JSON_DEPTH:
            return _too_deep(text)
    return value


def _too_deep(text: str) -> Unreadable:
    return Unreadable(
        error=f"JSON nested deeper than {MAX_JSON_DEPTH} levels", raw=str(text)[:2000]
    )


def json_depth(value: Any) -> int:
    """How many lists and objects deep ``value`` nests, found without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def stored_int(value: Any) -> int | Unreadable:
    """An integer column (``node_index``, ``iteration``) that SQLite let hold anything."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return Unreadable(error="not a whole number", raw=str(value)[:200])


@dataclass(frozen=True, slots=True)
class RunFacts:
    """One execution as the runs list needs it: counts, times, and its newest row."""

    execution_id: str
    agent: str
    row_count: int
    first_at: str
    last_at: str
    last_checkpoint_id: str
    last_node_id: str
    last_step_type: str | None
    last_status: str
    has_pending: bool
    pending_reason: str | None
    fork_parent_checkpoint_id: str | None
    rows_waiting: int
    rows_quarantined: int
    #: Why a run that ended ``failed`` was stopped on purpose: the SDK's ``run_reason``
    #: on its run-end row (``"cancelled"``, ``"timeout"``), else None.
    run_reason: str | None = None


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Filters and the keyset position for one page of the runs list."""

    state: str | None = None
    agent: str | None = None
    text: str | None = None
    after: tuple[str, str] | None = None
    limit: int = 50
    outbox: str | None = None


@dataclass(frozen=True, slots=True)
class IndexProgress:
    """How far the first indexing of a large store has got."""

    rows_read: int
    rows_total: int

    @property
    def percent(self) -> int:
        return min(100, self.rows_read * 100 // self.rows_total) if self.rows_total else 100


@dataclass(frozen=True, slots=True)
class SeedFailure:
    """A demo scenario that did not land, and why (its worker's own words)."""

    scenario: str
    reason: str


@dataclass(frozen=True, slots=True)
class SeedProgress:
    """How far ``localui demo`` has got seeding its store while it serves it."""

    landed: int
    total: int
    failures: tuple[SeedFailure, ...] = ()

    @property
    def finished(self) -> bool:
        return self.landed + len(self.failures) >= self.total


@dataclass(frozen=True, slots=True)
class RunFactsPage:
    runs: tuple[RunFacts, ...]
    #: ``(last_at, execution_id)`` of the last run on this page when more follow.
    next_key: tuple[str, str] | None
    counts: Mapping[str, int]
    #: Set while the store is being indexed: ``runs`` are then the runs written to
    #: most recently, read straight from the store, with no counts and no next page.
    indexing: IndexProgress | None = None


@dataclass(frozen=True, slots=True)
class AttentionQuery:
    """The runs that need a person: unfinished with a newest row before
    ``stale_before`` (stalled), failed, orphaned, paused before ``overdue_before``
    (overdue), or with rows the plane quarantined; newest activity first."""

    stale_before: str
    overdue_before: str
    after: tuple[str, str] | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True)
class AttentionCounts:
    """How many runs need a person for each reason (a run may count under two), and
    when the oldest pause began (None when nothing waits)."""

    stalled: int
    failed: int
    orphaned: int
    overdue: int
    quarantined: int
    oldest_pause_at: str | None
    #: Runs that need a person for any reason, each once.
    total: int

    def by_reason(self) -> dict[str, int]:
        return {
            "stalled": self.stalled,
            "failed": self.failed,
            "orphaned": self.orphaned,
            "overdue": self.overdue,
            "quarantined": self.quarantined,
        }


@dataclass(frozen=True, slots=True)
class FleetCounts:
    """What the runs index counts across the store, read after one catch-up in one
    snapshot: what a metrics scrape reports."""

    #: Runs per state (:data:`localui.backends.base.STATES`), as the runs list counts them.
    states: Mapping[str, int]
    attention: AttentionCounts
    rows_waiting: int
    rows_quarantined: int
    #: Pauses waiting for a person (the SDK's ``pending_interrupts``).
    pending: int


@dataclass(frozen=True, slots=True)
class AttentionPage:
    runs: tuple[RunFacts, ...]
    #: ``(last_at, execution_id)`` of the last run on this page when more follow.
    next_key: tuple[str, str] | None
    counts: AttentionCounts


@dataclass(frozen=True, slots=True)
class RowHeader:
    """A checkpoint row without its JSON payloads: cheap enough for 2,000 at once."""

    checkpoint_id: str
    execution_id: str
    parent_checkpoint_id: str | None
    agent: str
    node_id: str
    node_index: int | Unreadable
    step_type: str | None
    status: str
    interrupt_reason: str | None
    agent_path: str | None
    created_at: str
    synced: int | None
    sync_error: str | None


@dataclass(frozen=True, slots=True)
class RowDetail:
    """A checkpoint row with its payloads parsed (each may be :class:`Unreadable`)."""

    header: RowHeader
    state_snapshot: Any
    node_input: Any
    node_output: Any
    interrupt_context: Any
    iteration: int | Unreadable
    #: The column texts as stored, for the raw view.
    raw: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def unreadable(self) -> tuple[str, ...]:
        """Names of the payload columns that could not be parsed."""
        cols = {
            "state_snapshot": self.state_snapshot,
            "node_input": self.node_input,
            "node_output": self.node_output,
            "interrupt_context": self.interrupt_context,
        }
        return tuple(name for name, value in cols.items() if isinstance(value, Unreadable))


_PAYLOADS = ("state_snapshot", "node_input", "node_output", "interrupt_context")


def row_detail(header: RowHeader, row: Mapping[str, Any]) -> RowDetail:
    """A row's payload columns, as either store reads them (text), parsed for a page."""
    return RowDetail(
        header=header,
        state_snapshot=parse_json(row["state_snapshot"], {}),
        node_input=parse_json(row["node_input"], {}),
        node_output=parse_json(row["node_output"], {}),
        interrupt_context=parse_json(row["interrupt_context"], {}),
        iteration=stored_int(row["iteration"]),
        raw={name: row[name] for name in _PAYLOADS},
    )


@dataclass(frozen=True, slots=True)
class Pending:
    """A ``pending_interrupts`` row: a run waiting for a person."""

    execution_id: str
    agent: str
    node_id: str
    reason: str
    context: Any
    agent_path: str | None
    created_at: str
    #: The newest ``interrupted`` row of the run: the row a resume answers (the
    #: SDK's ``aresume`` picks it the same way). None if the store lost it.
    checkpoint_id: str | None = None


@dataclass(frozen=True, slots=True)
class PausedCall:
    """What a paused row holds about the call it paused in: the snapshot (the turn's
    messages, the tool's name and call id) and the call's input, parsed; and how many
    ``@idempotent`` results the run has stored (a resume reuses them); and how many rows
    and paused rows the run has, which say whether the SDK's read of the run (its first
    500 rows, in its own order) could find another row than this one."""

    checkpoint_id: str
    state_snapshot: Any
    node_input: Any
    cached_results: int
    run_rows: int
    run_pauses: int


@dataclass(frozen=True, slots=True)
class PendingPage:
    items: tuple[Pending, ...]
    next_key: tuple[str, str] | None
    total: int


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """An ``idempotency_cache`` row with its value unwrapped from the SDK's envelope."""

    execution_id: str
    function_key: str
    value: Any
    enveloped: bool
    created_at: str


def unwrap_cached(stored: Any) -> tuple[Any, bool]:
    """``(value, enveloped)``: the SDK wraps results since 1.92, older rows hold them bare."""
    if isinstance(stored, dict) and stored.keys() == {IDEMPOTENT_ENVELOPE}:
        return stored[IDEMPOTENT_ENVELOPE], True
    return stored, False


@dataclass(frozen=True, slots=True)
class ForkLink:
    """A fork: the new run, and the row of the source run it branched from."""

    execution_id: str
    source_execution_id: str | None
    source_checkpoint_id: str
    source_node_id: str | None
    created_at: str


@dataclass(frozen=True, slots=True)
class StoreTotals:
    rows: int
    rows_waiting: int
    rows_quarantined: int
    pending: int


@dataclass(frozen=True, slots=True)
class PruneRun:
    """One run a prune would touch: how many of its rows go, and whether any stay."""

    execution_id: str
    agent: str
    rows_deleted: int
    rows_kept: int


@dataclass(frozen=True, slots=True)
class PrunePreview:
    """What ``Checkpointer.prune`` would delete before ``cutoff``, by the SDK's predicate:
    ``completed``/``failed`` rows and cache rows older than the cutoff, never a pause."""

    cutoff: str
    checkpoint_rows: int
    cache_rows: int
    runs: tuple[PruneRun, ...]
    #: ``interrupted`` rows older than the cutoff, which prune keeps.
    pauses_kept: int
    #: Cache entries it deletes of runs that can still resume (paused, unfinished,
    #: failed): a resume after the prune runs those side effects again.
    resumable_cache: Mapping[str, int] = field(default_factory=dict)

    @property
    def would_delete(self) -> int:
        return self.checkpoint_rows + self.cache_rows


@dataclass(frozen=True, slots=True)
class CachePage:
    entries: tuple[CacheEntry, ...]
    next_key: tuple[str, str] | None
    total: int


#: Kinds of decision in the app's own record (``localui_decisions``).
APPROVAL = "approval"
RESUME = "resume"
#: An operator re-armed an orphaned pause no decision explains (``ActionService.reopen``).
REOPEN = "reopen"
#: A branch that went on from a row whose conversation or state a person edited
#: (recorded on the branch, with the source row and what changed).
EDIT = "edit"
#: A listing entry of the decision record that is a vote (``localui_votes``): one
#: approval a two-person rule counted, not the one that completed the count.
VOTE = "vote"
#: The outcome of a claim whose run the SDK had already resumed elsewhere: it decided nothing.
ALREADY_RESUMED = "already_resumed"
#: The key of an approval's metadata that keeps the state an operator edited with it
#: (a chain's pause decided with ``Chain.aresume(modified_state=)``): what changed and
#: the state itself. The SDK gets the state as ``modified_state``; the tool never sees it.
STATE_EDIT = "localui_state_edit"


@dataclass(frozen=True, slots=True)
class Decision:
    """One recorded decision. ``outcome`` is None while the SDK is still working on it."""

    id: int
    kind: str
    execution_id: str
    checkpoint_id: str
    approved: bool | None
    actor: str
    reason: str
    decided_at: str
    outcome: str | None
    detail: str | None
    finished_at: str | None
    #: What the decision hands the tool as ``Resume.metadata`` (approver, reason, and
    #: whatever a policy adds; see :attr:`resume_metadata`), an edit's source and changes;
    #: None on a record written before it was kept.
    metadata: Mapping[str, Any] | None = None
    #: When the process carrying the decision out last said it is alive: while it
    #: keeps saying so, nobody takes the decision over (``localui.recovery``).
    heartbeat_at: str | None = None
    #: The paused row localui wrote again for this decision after the process that
    #: claimed it died, when it had to (``localui.recovery``).
    rearmed_checkpoint_id: str | None = None

    @property
    def bound_checkpoint_id(self) -> str:
        """The paused row this decision now acts on: the re-armed one, or the one seen."""
        return self.rearmed_checkpoint_id or self.checkpoint_id

    @property
    def resume_metadata(self) -> dict[str, Any] | None:
        """Exactly what the tool receives as ``Resume.metadata``: the recorded metadata
        without a state edit (:data:`STATE_EDIT`), which the SDK gets on its own."""
        if self.metadata is None:
            return None
        return {k: v for k, v in self.metadata.items() if k != STATE_EDIT}

    @property
    def state_edit(self) -> Mapping[str, Any] | None:
        """A chain's state an operator edited with this approval or rejection (its
        ``state``, and the ``changes`` it made), or None."""
        edit = (self.metadata or {}).get(STATE_EDIT)
        return edit if isinstance(edit, Mapping) else None

    @property
    def edited_state(self) -> dict[str, Any] | None:
        """The state to hand the SDK as ``modified_state`` when this decision is carried
        out: an approval's state edit, or a resume's edited state."""
        edit = self.state_edit if self.kind == APPROVAL else self.metadata
        state = edit.get("state") if edit is not None else None
        return dict(state) if isinstance(state, Mapping) else None

    @property
    def verb(self) -> str:
        if self.kind == RESUME:
            return "resumed"
        if self.kind == REOPEN:
            return "re-opened"
        if self.kind == EDIT:
            return "edited and went on"
        if self.kind == VOTE:
            return "voted to approve"
        return "approved" if self.approved else "rejected"


@dataclass(frozen=True, slots=True)
class DecisionQuery:
    """Filters and the keyset position for one page of the decision record, newest
    first. ``after`` is ``(decided_at, id)`` of the last entry of the page before."""

    actor: str | None = None
    #: Decisions on runs of this agent (a team's runs under the team's name).
    agent: str | None = None
    outcome: str | None = None
    kind: str | None = None
    #: ISO instants: decided at or after ``since``, before ``until``.
    since: str | None = None
    until: str | None = None
    after: tuple[str, str] | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True)
class DecisionEntry:
    """One entry of the decision record, with the agent of its run (empty when the
    runs index does not know the run)."""

    decision: Decision
    agent: str


@dataclass(frozen=True, slots=True)
class DecisionPage:
    entries: tuple[DecisionEntry, ...]
    next_key: tuple[str, str] | None


@dataclass(frozen=True, slots=True)
class ExportPage:
    """One page of the decision record as an export writes it: plain tuples in the
    order of ``localui.backends.decisions.EXPORT_FIELDS`` (an export writes a hundred
    thousand of them, so no record objects), newest first."""

    rows: tuple[tuple[Any, ...], ...]
    next_key: tuple[str, str] | None


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of trying to claim: ``won`` with our row, or the row that beat us."""

    won: bool
    decision: Decision


@dataclass(frozen=True, slots=True)
class Vote:
    """One person's approval of a pause that needs more than one (``localui.policy``),
    bound to the paused row they saw. The approval that completes the count is a
    decision as well; a vote alone changes nothing in the run."""

    id: int
    execution_id: str
    checkpoint_id: str
    actor: str
    reason: str
    #: The fields this person filled in, as JSON text (typed values by field name).
    fields_json: str
    voted_at: str


#: What casting a vote did: ``counted`` (it is among ``votes``), ``again`` (this
#: person had voted already), ``full`` (enough people had approved already).
COUNTED, AGAIN, FULL = "counted", "again", "full"


@dataclass(frozen=True, slots=True)
class Ballot:
    result: str
    #: The pause's votes in the order cast, after this one.
    votes: tuple[Vote, ...]


@dataclass(frozen=True, slots=True)
class User:
    """A person who may sign in to a store's servers (``localui users``)."""

    name: str
    role: str
    #: SHA-256 of the personal token, hex; a session remembers its first characters,
    #: so a reset token ends the sessions opened with the old one.
    token_sha256: str
    created_at: str
    #: The groups an approval policy's ``group:NAME`` names (``--group``).
    groups: tuple[str, ...] = ()
    #: Where this person is told of pauses they may decide: an Apprise URL
    #: (``mailto://…``, ``json://…``; ``--notify``), which may hold secrets, so it is
    #: shown only masked (``localui.notify.targets``); empty: nowhere of their own.
    address: str = ""
    #: Who decides for this person while they are away (``localui users away``), and
    #: until when (ISO UTC; empty: until they are back); both empty: not away.
    away_to: str = ""
    away_until: str = ""

    @property
    def token_mark(self) -> str:
        return self.token_sha256[:16]
