"""What every backend gives the app: the protocols, and the vocabulary they share.

A :class:`Backend` is one kind of store (a SQLite file, a PostgreSQL schema)
opened once by :func:`localui.backends.open_backend`: its :class:`Store` (the
read model), its :class:`ChangeSource` (what the live pages hear), its
:class:`DecisionLog` (the app's own record and lock), its :class:`UserDirectory`
(who may sign in), the SDK checkpointer that prune uses, and the
:class:`StoreTarget` agents are bound to.

Every store, source and log method is synchronous and may block on I/O: views
call them off the event loop. Implementations never write the SDK's tables.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from localui.audit import AuditEntry, AuditEvent, AuditPage, AuditQuery
from localui.backends.deadlines import Deadline
from localui.backends.decisions import ABANDONED_AFTER_SECONDS
from localui.backends.keys import Key, Shared
from localui.backends.notes import Note
from localui.backends.notifications import Notice, Notification, TargetStatus
from localui.records import (
    AttentionCounts,
    AttentionPage,
    AttentionQuery,
    Ballot,
    CacheEntry,
    CachePage,
    Claim,
    Decision,
    DecisionPage,
    DecisionQuery,
    ExportPage,
    FleetCounts,
    ForkLink,
    IndexProgress,
    PausedCall,
    Pending,
    PendingPage,
    PrunePreview,
    RowDetail,
    RowHeader,
    RunFacts,
    RunFactsPage,
    RunQuery,
    StoreTotals,
    User,
    Vote,
)

#: The vocabulary of run states (DESIGN.md); the rules that derive them live in
#: ``localui.runs`` and the PostgreSQL store's SQL mirrors them for filtering.
STATES = ("completed", "failed", "cancelled", "timed_out", "paused", "orphaned", "unfinished")


class Store(Protocol):
    """Read access to one checkpoint store."""

    #: Where the store is, as a person would recognise it (a path or a redacted URL).
    location: str

    def list_runs(self, query: RunQuery) -> RunFactsPage:
        """One page of runs, newest activity first, with counts per state."""
        ...

    def get_run(self, execution_id: str) -> RunFacts | None: ...

    def listed(self, execution_id: str) -> bool:
        """Whether the runs index lists the run, as it is now: it lags the store while it
        catches up, and after a prune it lists the pruned runs until it has walked the
        store again (a minute or more at a million runs). Read only to explain why a
        run the list showed has no rows."""
        ...

    def run_reads(
        self, execution_id: str
    ) -> tuple[RunFacts | None, tuple[RowHeader, ...], tuple[CacheEntry, ...]]:
        """:meth:`get_run`, :meth:`list_rows` and :meth:`list_cache` at once: what a run
        page reads first."""
        ...

    def compare_reads(
        self, execution_ids: Sequence[str]
    ) -> Mapping[str, tuple[RunFacts | None, tuple[RowHeader, ...], ForkLink | None]]:
        """:meth:`get_run`, :meth:`list_rows` and :meth:`get_fork_origin` of each run at
        once, by execution id: what a comparison of runs reads first."""
        ...

    def list_attention(self, query: AttentionQuery) -> AttentionPage:
        """One page of the runs that need a person, from the runs index, newest first,
        with how many there are for each reason."""
        ...

    def attention_counts(self, stale_before: str, overdue_before: str) -> AttentionCounts:
        """How many runs need a person for each reason, from the runs index."""
        ...

    def fleet_counts(self, stale_before: str, overdue_before: str) -> FleetCounts | None:
        """Runs per state, how many need a person for each reason, the outbox totals and
        the pending pauses, from the runs index after one catch-up, in one snapshot (what
        a metrics scrape reads); None while the index is first built."""
        ...

    def indexing(self) -> IndexProgress | None:
        """How far the first build of the runs index has got while one runs in the
        background (after bringing it up to date), or None when it is complete or the
        store keeps none: what waits for it (the watcher's sweeps) asks this first."""
        ...

    def list_rows(self, execution_id: str) -> tuple[RowHeader, ...]:
        """The run's rows in the order they were written, without payloads."""
        ...

    def get_row(self, checkpoint_id: str) -> RowDetail | None:
        """One row with its payloads; checkpoint ids are unique across runs."""
        ...

    def list_rows_of(self, execution_ids: Sequence[str]) -> Mapping[str, tuple[RowHeader, ...]]:
        """Each run's rows as :meth:`list_rows` gives them, for a page of runs in one
        query, by execution id (runs with no rows are left out)."""
        ...

    def get_rows(self, checkpoint_ids: Sequence[str]) -> Mapping[str, RowDetail]:
        """Each of these rows as :meth:`get_row` gives it, in one query, by the
        checkpoint id asked for (rows gone are left out)."""
        ...

    def row_times(self, checkpoint_ids: Sequence[str]) -> Mapping[str, str]:
        """When each of these rows was written, by checkpoint id (rows gone are left out)."""
        ...

    def same_payloads(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """The pairs of rows (by checkpoint id) whose payloads (state snapshot, node
        input and output, interrupt context) the store holds as equal, found without
        reading them out. A pair left out may still be equal in value (the same JSON
        written another way): read its rows to tell."""
        ...

    def get_pending(self, execution_id: str) -> Pending | None: ...

    def list_pending(
        self, *, after: tuple[str, str] | None = None, limit: int = 50, newest_first: bool = False
    ) -> PendingPage:
        """Pending interrupts ordered by ``(created_at, execution_id)``."""
        ...

    def paused_calls(self, pending: Sequence[Pending]) -> Mapping[str, PausedCall]:
        """For a page of pauses, by checkpoint id: the paused rows' snapshot and input,
        and their runs' cached results; two queries for the whole page."""
        ...

    def list_cache(self, execution_id: str) -> tuple[CacheEntry, ...]: ...

    def list_cache_of(self, execution_ids: Sequence[str]) -> Mapping[str, tuple[CacheEntry, ...]]:
        """Each run's cached results as :meth:`list_cache` gives them, in one query, by
        execution id (runs with none are left out)."""
        ...

    def list_cache_before(
        self, cutoff: str, *, after: tuple[str, str] | None = None, limit: int = 50
    ) -> CachePage:
        """Cache entries written before ``cutoff``, oldest first: what prune would remove."""
        ...

    def get_fork_origin(self, execution_id: str) -> ForkLink | None:
        """The row this run was forked from, when it is a fork."""
        ...

    def list_forks(self, execution_id: str) -> tuple[ForkLink, ...]:
        """Runs forked from any row of this run."""
        ...

    def fork_family(self, execution_id: str) -> tuple[ForkLink | None, tuple[ForkLink, ...]]:
        """:meth:`get_fork_origin` and :meth:`list_forks` at once: what a run page shows."""
        ...

    def totals(self) -> StoreTotals: ...

    def count_pending(self) -> int: ...

    def get_project_id(self, execution_id: str) -> str | None: ...

    def prune_preview(self, cutoff: str) -> PrunePreview:
        """What the SDK's ``prune`` would delete for rows older than ``cutoff``."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed in the store since the previous poll."""

    #: Runs that got new rows, or whose rows changed (outbox flags).
    runs: frozenset[str] = frozenset()
    #: Runs that paused on an interrupt (a new ``pending_interrupts`` row).
    pauses_added: frozenset[str] = frozenset()
    #: Runs whose pause was claimed, by an approval here or anywhere else.
    pauses_removed: frozenset[str] = frozenset()
    #: Runs with a new or finished decision in the app's own record.
    decided: frozenset[str] = frozenset()
    #: Runs whose pause got a vote, or lost one, under a rule that needs several people:
    #: the pause stays, and what its card says of the rule changes.
    voted: frozenset[str] = frozenset()
    #: Runs whose pause got a note (``localui.backends.notes``): the pause stays, and
    #: its card shows one note more.
    noted: frozenset[str] = frozenset()
    #: Something changed that cannot be pinned to runs (the schema): refresh all.
    everything: bool = False
    #: The feed's count of published changes; stamped by ``localui.live.ChangeFeed``.
    seq: int = 0

    def __bool__(self) -> bool:
        return bool(
            self.everything
            or self.runs
            or self.pauses_added
            or self.pauses_removed
            or self.decided
            or self.voted
            or self.noted
        )

    @property
    def pauses_changed(self) -> bool:
        return self.everything or bool(self.pauses_added or self.pauses_removed)

    @property
    def runs_changed(self) -> bool:
        return self.everything or bool(self.runs or self.pauses_added or self.pauses_removed)

    def touches(self, execution_id: str) -> bool:
        """Whether a page about this one run must be rendered again."""
        return self.everything or any(
            execution_id in ids
            for ids in (
                self.runs,
                self.pauses_added,
                self.pauses_removed,
                self.decided,
                self.voted,
                self.noted,
            )
        )

    def merge(self, other: Changes) -> Changes:
        """Both changes as one, for a subscriber that fell behind by a few."""
        return Changes(
            runs=self.runs | other.runs,
            pauses_added=self.pauses_added | other.pauses_added,
            pauses_removed=self.pauses_removed | other.pauses_removed,
            decided=self.decided | other.decided,
            voted=self.voted | other.voted,
            noted=self.noted | other.noted,
            everything=self.everything or other.everything,
            seq=max(self.seq, other.seq),
        )


class ChangeSource(Protocol):
    """Tells the change feed what changed in one store. Methods block: the feed runs
    them in a worker thread, one at a time."""

    def reset(self) -> None:
        """Take the store as it is now as the baseline for the next :meth:`poll`."""
        ...

    def poll(self) -> Changes | None:
        """What changed since the last poll or reset; None when nothing did."""
        ...

    def close(self) -> None: ...


class DecisionLog(Protocol):
    """The app's record of decisions, and its exactly-once lock (see
    ``localui.backends.decisions``)."""

    def claim(
        self,
        *,
        kind: str,
        execution_id: str,
        checkpoint_id: str,
        approved: bool | None,
        actor: str,
        reason: str,
        still_pending: Callable[[], bool],
        metadata: Mapping[str, Any] | None = None,
        agent: str | None = None,
    ) -> Claim:
        """Claim ``(kind, execution_id, checkpoint_id)``, recording ``metadata``: exactly
        what the decision hands the SDK, so a recovery can carry the same decision out;
        and ``agent``, the run's owner, which the record lists the entry under."""
        ...

    def finish(self, decision_id: int, outcome: str, detail: str | None) -> Decision: ...

    def release(self, decision_id: int) -> None:
        """Delete a claim that never reached the SDK, so the pause can be decided again."""
        ...

    #: How long a claim with no outcome may go without a heartbeat before another
    #: process may take it over (``localui.backends.decisions``).
    lease_seconds: float

    def heartbeat(self, decision_id: int) -> None:
        """Say the process carrying the unfinished decision out is alive."""
        ...

    def set_rearmed(self, decision_id: int, checkpoint_id: str) -> None:
        """Record the paused row written again for the unfinished decision."""
        ...

    def list_abandoned(self) -> tuple[Decision, ...]:
        """Unfinished decisions whose process has gone quiet for longer than the lease."""
        ...

    def take_over(self, decision_id: int) -> Decision | None:
        """Renew an abandoned decision's lease for this process, or None when it is not
        abandoned (anymore): of processes that try at once, one gets it."""
        ...

    def list_for_run(self, execution_id: str) -> tuple[Decision, ...]: ...

    def list_decisions(self, query: DecisionQuery) -> DecisionPage:
        """One page of the whole record, newest first (``decided_at``, then ``id``),
        each entry with its run's agent."""
        ...

    def list_export(self, query: DecisionQuery) -> ExportPage:
        """The same page as :meth:`list_decisions`, as the plain rows an export writes
        (``localui.backends.decisions.EXPORT_FIELDS``)."""
        ...

    def finished_since(self, after: tuple[str, int] | None, limit: int) -> tuple[Decision, ...]:
        """Decisions with an outcome, in the order they got it (``finished_at``, then
        ``id``), after ``after``: what the metrics fold in since their last look."""
        ...

    def latest_for_runs(self, kind: str, execution_ids: Sequence[str]) -> Mapping[str, Decision]:
        """Each run's newest decision of ``kind`` (finished or not), for a page of runs
        in one query; runs without one are left out."""
        ...

    def cast_vote(
        self,
        *,
        execution_id: str,
        checkpoint_id: str,
        actor: str,
        reason: str,
        fields_json: str,
        needed: int,
        agent: str | None = None,
    ) -> Ballot:
        """Record ``actor``'s approval of the pause at ``checkpoint_id`` (of a run of
        ``agent``), unless they approved it already or ``needed`` people have: one vote
        at a time per pause, across processes, so exactly one vote is the one that
        completes the count."""
        ...

    def withdraw_vote(self, vote_id: int) -> None:
        """Delete a vote whose approval could not be carried out (another decision won)."""
        ...

    def votes_for(
        self, pauses: Sequence[tuple[str, str]]
    ) -> Mapping[tuple[str, str], tuple[Vote, ...]]:
        """The votes on each ``(execution_id, checkpoint_id)``, in order, in one query;
        pauses without votes are left out."""
        ...

    def votes_for_run(self, execution_id: str) -> tuple[Vote, ...]:
        """Every vote on any pause of the run, in order (the run's decisions show them)."""
        ...

    def close(self) -> None: ...


class Outbox(Protocol):
    """The notifications outbox (``localui.backends.notifications``): what the watcher
    recorded, and how its delivery to each target went."""

    def record(
        self, notices: Sequence[Notice], targets: Sequence[str], *, now: float, give_up_at: float
    ) -> int:
        """Each notice for each target, unless already recorded; how many rows are new."""
        ...

    def recorded(self, keys: Collection[str], targets: Sequence[str]) -> set[str]:
        """Those of ``keys`` already recorded for every one of ``targets``: a read, so a
        sweep offers again only what is new without writing (or reading its call)."""
        ...

    def claim_due(
        self, *, now: float, lease: float, limit: int, targets: Sequence[str]
    ) -> tuple[Notification, ...]:
        """Due rows of ``targets`` (the caller's) no one else holds, oldest first, leased
        to the caller until ``now + lease``. Rows of other targets are left to the
        processes started with them: claimed and let go again, they would come first in
        every round and hold back the caller's own."""
        ...

    def mark_sent(self, ids: Sequence[int], *, now: float) -> None: ...

    def mark_attempt_failed(
        self, ids: Sequence[int], error: str, *, next_at: float | None, now: float
    ) -> None:
        """One more failed attempt: due again at ``next_at``, or given up on when None."""
        ...

    def release(self, ids: Sequence[int]) -> None:
        """Let go of claimed rows not tried this round: due again at once."""
        ...

    def list_recent(self, limit: int) -> tuple[Notification, ...]:
        """The newest rows first."""
        ...

    def target_statuses(self) -> tuple[TargetStatus, ...]: ...

    def retry_failed(self, *, now: float, give_up_at: float, target: str | None = None) -> int:
        """Make given-up rows due again (all, or one target's); how many."""
        ...

    def give_up_unconfigured(
        self, *, targets: Sequence[str], now: float, detail: str, limit: int
    ) -> int:
        """Give up on (with ``detail`` as their error) at most ``limit`` waiting rows of
        targets not in ``targets`` (the caller's) whose ``give_up_at`` has passed and that
        no process holds; how many. Not before: another process may serve that target."""
        ...

    def looked_at(self) -> float | None:
        """Up to when the watchers' sweeps offered every failure and decision and
        recorded them (``localui.backends.watch``); None before the first."""
        ...

    def advance_looked_at(self, to: float) -> None:
        """Move :meth:`looked_at` to ``to``, only forward (made when missing)."""
        ...

    def rename_target(self, old: str, new: str) -> int:
        """Move ``old``'s rows to ``new`` (and ``old``'s text in their errors), but an
        event ``new`` has already; how many. A target keeps its rows when the form of
        its id changes."""
        ...

    def close(self) -> None: ...


class UserDirectory(Protocol):
    """The people who may sign in (``localui.backends.users``): reads for the server,
    writes for ``localui users`` (and a person's own away, from their menu)."""

    def by_token_hash(self, digest: str) -> User | None: ...

    def by_name(self, name: str) -> User | None: ...

    def list_users(self) -> tuple[User, ...]:
        """Everyone, by name, each with their role, groups, address and away: what
        announcing a pause to each person who may decide it reads
        (``localui.delegation.deciders``)."""
        ...

    def add(
        self,
        name: str,
        role: str,
        digest: str,
        groups: Sequence[str] = (),
        address: str = "",
    ) -> User:
        """A new person; :class:`~localui.errors.Conflict` when the name is taken."""
        ...

    def set_address(self, name: str, address: str) -> User | None:
        """A person's own address (an Apprise URL, checked by the caller; empty: none);
        None if no such person."""
        ...

    def set_away(self, name: str, to: str, until: str) -> User | None:
        """Who decides for a person while they are away, until when (ISO UTC, empty:
        until they are back); both empty: back. Checked by the caller
        (``localui.delegation.away_problem``); None if no such person."""
        ...

    def set_groups(self, name: str, groups: Sequence[str]) -> User | None:
        """A person's groups, replaced; None if no such person."""
        ...

    def set_role(self, name: str, role: str) -> User | None:
        """Change a person's role; None when there is no such person."""
        ...

    def set_token(self, name: str, digest: str) -> User | None:
        """A new token for a person (the old one stops working); None if no such person."""
        ...

    def remove(self, name: str) -> bool: ...

    def close(self) -> None: ...


class SessionKeys(Protocol):
    """The keys sessions, previews and links are signed with, and the sessions ended
    by signing out, shared by every process on the store (``localui.backends.keys``)."""

    def shared(self, ended_after: float) -> Shared | None:
        """The keys still accepted and the sign-outs since ``ended_after`` (Unix
        seconds); a writable one makes the tables and the first key when there are
        none, a read-only one answers None until then."""
        ...

    def rotate(self, grace_seconds: float) -> tuple[Key, ...]:
        """A new newest key; the older ones are accepted ``grace_seconds`` more."""
        ...

    def end_session(self, session_id: str, expires_at: float) -> None:
        """Record a session signed out (kept until it would have expired anyway)."""
        ...

    def close(self) -> None: ...


class AuditLog(Protocol):
    """Every change made through localui, hash-chained (``localui.audit``): appends for
    the server and the command line, reads for ``/audit`` and ``localui audit``."""

    def append(self, event: AuditEvent) -> AuditEntry:
        """``event`` as the chain's next row (serialised across processes)."""
        ...

    def list_entries(self, query: AuditQuery) -> AuditPage:
        """A page of rows, newest first."""
        ...

    def walk(self) -> Iterator[AuditEntry]:
        """Every row, oldest first, read a batch at a time."""
        ...

    def close(self) -> None: ...


class NoteLog(Protocol):
    """Notes on pauses (``localui.backends.notes``): what people who may decide a pause
    tell each other about it. Never a decision, never a vote."""

    def add(self, execution_id: str, checkpoint_id: str, author: str, text: str) -> Note:
        """A new note on the pause at ``checkpoint_id``, stamped now."""
        ...

    def for_pauses(
        self, pauses: Sequence[tuple[str, str]]
    ) -> Mapping[tuple[str, str], tuple[Note, ...]]:
        """The notes on each ``(execution_id, checkpoint_id)``, oldest first, in one
        query; pauses without notes are left out."""
        ...

    def for_run(self, execution_id: str) -> tuple[Note, ...]:
        """Every note on any pause of the run, oldest first."""
        ...

    def written_since(self, after: tuple[str, int], limit: int) -> tuple[Note, ...]:
        """Notes after ``(created_at, id)``, in that order: what a watcher offers."""
        ...

    def close(self) -> None: ...


class Deadlines(Protocol):
    """The deadlines of pauses a policy rule gives a ``due``
    (``localui.backends.deadlines``); keys are ``(execution_id, checkpoint_id)``."""

    def record(self, rows: Sequence[Deadline]) -> int:
        """Record the rows not recorded yet (by any process); how many were new."""
        ...

    def list_keys(self) -> set[tuple[str, str]]:
        """Every recorded pause."""
        ...

    def list_work(self, now: float, limit: int) -> tuple[Deadline, ...]:
        """Rows past their ``due_at`` not escalated, or past their ``timeout_at`` not
        timed out, soonest due first."""
        ...

    def mark_escalated(self, key: tuple[str, str], now: float) -> bool:
        """Set ``escalated_at`` unless set: True for the one process that set it."""
        ...

    def mark_timed_out(self, key: tuple[str, str], now: float) -> bool:
        """Set ``timed_out_at`` unless set: True for the one process that set it."""
        ...

    def forget(self, keys: Sequence[tuple[str, str]]) -> int:
        """Delete the rows of pauses that no longer wait."""
        ...

    def by_due(self, after: tuple[float, str] | None, limit: int) -> tuple[Deadline, ...]:
        """Rows soonest due first (``due_at``, then ``execution_id``), after ``after``."""
        ...

    def get_many(self, keys: Sequence[tuple[str, str]]) -> Mapping[tuple[str, str], Deadline]:
        """The rows of these pauses, in one query; those without one are left out."""
        ...

    def list_overdue(self, now: float, limit: int) -> tuple[Deadline, ...]:
        """Rows past their ``due_at``, soonest due first."""
        ...

    def close(self) -> None: ...


class Prunes(Protocol):
    """The one SDK checkpointer method the app calls: prune goes through the SDK."""

    def prune(self, older_than: Any) -> int: ...


@dataclass(frozen=True, slots=True)
class StoreTarget:
    """What a registered agent must write to: a SQLite file or a PostgreSQL schema."""

    sqlite_path: Path | None = None
    pg_dsn: str | None = None
    pg_schema: str = "fastaiagent"

    def describe(self) -> str:
        if self.sqlite_path is not None:
            return str(self.sqlite_path)
        from localui.backends.urls import redact

        where = f" of {redact(self.pg_dsn)}" if self.pg_dsn else ""
        return f"PostgreSQL schema {self.pg_schema}{where}"


class Backend(Protocol):
    """One opened store and everything the app needs beside it."""

    @property
    def kind(self) -> str:
        """``sqlite`` or ``postgres`` (``localui.runs.SQLITE``/``POSTGRES``): the SDK's
        checkpointer lists a run's rows in a different order on each, and what a resume
        re-enters follows that order (``localui.runs.sdk_history``)."""
        ...

    @property
    def label(self) -> str:
        """The store as pages show it: a path, or a URL without its password."""
        ...

    @property
    def store(self) -> Store: ...

    @property
    def target(self) -> StoreTarget:
        """What agents registered with ``--agents`` must write to (``localui.registry``)."""
        ...

    def change_source(self) -> ChangeSource:
        """A source of its own for the change feed (the feed closes it)."""
        ...

    def decision_log(
        self, *, writable: bool, lease_seconds: float = ABANDONED_AFTER_SECONDS
    ) -> DecisionLog:
        """The decision record in the store's own database (the caller closes it)."""
        ...

    def outbox(self) -> Outbox:
        """The notifications outbox in the store's own database (the caller closes it)."""
        ...

    def session_keys(self, *, writable: bool) -> SessionKeys:
        """The keys every process on the store signs with (``localui.backends.keys``)."""
        ...

    def users(self, *, writable: bool) -> UserDirectory:
        """The users table in the store's own database (the caller closes it)."""
        ...

    def audit_log(self, *, writable: bool) -> AuditLog:
        """The audit log in the store's own database (the caller closes it)."""
        ...

    def notes(self, *, writable: bool) -> NoteLog:
        """Notes on pauses in the store's own database (the caller closes it)."""
        ...

    def deadlines(self, *, writable: bool) -> Deadlines:
        """The pauses' deadlines in the store's own database (the caller closes it)."""
        ...

    def checkpointer(self) -> Prunes:
        """An SDK checkpointer on the served store, for prune."""
        ...

    def close(self) -> None:
        """Close the store (sources and logs are closed by whoever asked for them)."""
        ...
