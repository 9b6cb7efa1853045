"""Forks and edits: a new branch of a run, through the SDK, in process.

A plain fork is the runner's own ``afork``; an edit goes on from a row whose
conversation (an agent's) or state (a chain's) a person changed. Both make the same
checks every action makes first (``localui.preflight``), and an edit is kept in the
decision record (kind ``edit``, on the branch) before the branch runs on. The source
run is never written.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from localui import edits, names, runs
from localui.actions import ActionService, Outcome, result_text
from localui.errors import BadRequest, LocalUIError, NotFound, Refused
from localui.offloop import off_loop
from localui.records import EDIT, FORK_ORIGIN_NODE, FORK_ORIGIN_STEP, Claim, RowDetail
from localui.registry import project_scope, run_tools


class Branching:
    """Fork a run, or edit a row and go on from it, with ``actions``' store, runners,
    checks and decision record."""

    def __init__(self, actions: ActionService) -> None:
        self.actions = actions

    async def _branch_point(
        self, execution_id: str, checkpoint_id: str | None
    ) -> tuple[RowDetail | None, runs.Owner, Any]:
        """The row named to branch from (None when the SDK picks it), the run's owner and
        its runner here; or the refusal that stops the branch before anything is written."""
        detail = None
        if checkpoint_id:
            detail = await off_loop(self.actions.store.get_row, checkpoint_id)
            if detail is None or detail.header.execution_id != execution_id:
                raise NotFound(f"run {execution_id!r} has no row {checkpoint_id!r}")
            refusal = runs.fork_refusal(detail.header)
            if refusal is not None:
                raise Refused(refusal.reason)
        owner = runs.run_owner(await off_loop(self.actions.store.list_rows, execution_id))
        problem = self.actions.preflight.fork_problem(owner)
        if problem is not None:
            raise Refused(problem)
        runner = self.actions.registry.get(owner.name)
        if runner is None:
            raise Refused(f"no runner named {owner.name!r} is registered here")
        return detail, owner, runner

    async def _record_edit(
        self,
        branch_id: str,
        execution_id: str,
        checkpoint_id: str,
        found: Sequence[Any],
        actor: str,
        agent: str,
    ) -> Claim:
        """Who edited what, kept on the branch (kind ``edit``) in the decision record."""
        return await off_loop(
            lambda: self.actions.decisions.claim(
                kind=EDIT,
                execution_id=branch_id,
                checkpoint_id=checkpoint_id,
                approved=None,
                actor=actor,
                reason="",
                still_pending=lambda: False,
                metadata=edits.edit_record(execution_id, checkpoint_id, tuple(found)),
                agent=agent,
            )
        )

    # --- fork ----------------------------------------------------------

    async def fork(
        self, execution_id: str, *, checkpoint_id: str | None, new_input: str | None
    ) -> Outcome:
        self.actions.preflight.ensure_writable()
        facts = await off_loop(self.actions.store.get_run, execution_id)
        if facts is None:
            raise NotFound(f"no run with execution id {execution_id!r} in this store")
        _, owner, agent = await self._branch_point(execution_id, checkpoint_id)
        context = await self.actions.context_of(owner, "afork", execution_id)
        given = {"context": context} if context is not None else {}
        project = await off_loop(self.actions.store.get_project_id, execution_id)
        try:
            with project_scope(project):
                result = await agent.afork(
                    execution_id,
                    checkpoint_id=checkpoint_id or None,
                    input=new_input or None,
                    **given,
                )
        except Exception as exc:
            return Outcome(
                execution_id, "fork", "failed", None, f"{type(exc).__name__}: {exc}", None
            )
        return Outcome(
            execution_id,
            "fork",
            "forked",
            result_text(result.output),
            None,
            None,
            new_execution_id=result.execution_id,
        )

    # --- edit and go on -----------------------------------------------

    async def fork_edited(
        self,
        execution_id: str,
        *,
        checkpoint_id: str,
        messages: list[dict[str, Any]] | None = None,
        state: dict[str, Any] | None = None,
        actor: str,
    ) -> Outcome:
        """A branch that goes on from the row ``checkpoint_id`` with its conversation
        (an agent's ``messages``) or its state (a chain's) edited. The source run is not
        touched; who edited what is kept in the decision record (kind ``edit``, on the
        branch) before the branch runs on.

        A chain forks with the SDK's own ``modified_state``. An agent has no such
        argument: its branch re-enters at its ``__fork_origin__`` row with that row's
        conversation, so that row is written, through the checkpointer's own ``put``,
        as ``Agent.afork`` writes it but holding the edited conversation, and the SDK's
        ``aresume`` carries the branch on from it (the model is called again at the
        row's turn and sees the edit).
        """
        self.actions.preflight.ensure_writable()
        actor = names.typed_name("actor", actor) or "someone"
        if not checkpoint_id:
            raise BadRequest("checkpoint_id (the row to edit and go on from) is required")
        detail, owner, runner = await self._branch_point(execution_id, checkpoint_id)
        assert detail is not None  # a checkpoint id was named: its row, or NotFound
        project = await off_loop(self.actions.store.get_project_id, execution_id)
        if owner.kind == runs.CHAIN:
            if state is None:
                raise BadRequest("a chain's row is edited as its state: send state, not messages")
            found_state = edits.state_changes(dict(detail.state_snapshot), state)
            context = await self.actions.context_of(owner, "afork", execution_id)
            return await self._fork_chain_edited(
                runner, execution_id, checkpoint_id, state, found_state, actor, project, context
            )
        if messages is None:
            raise BadRequest("an agent's row is edited as its conversation: send messages")
        source = list(detail.state_snapshot.get("messages") or ())
        found = edits.changes(source, messages)
        if not found:
            raise BadRequest(
                "the conversation is the row's own: nothing was edited (a fork without "
                "an input goes on from it as it is)"
            )
        has = [t.name for t in run_tools(runner)]
        for tool in edits.tools_called(messages):
            if tool not in has:
                raise Refused(
                    f"the edited conversation calls {tool!r}, a tool {owner.name!r} here does "
                    f"not have (it has: {', '.join(has) or 'none'}): the branch could not run it"
                )
        loaded = await off_loop(_loaded_messages, messages)
        context = await self.actions.context_of(owner, "aresume", execution_id)
        branch_id = str(uuid.uuid4())
        claim = await self._record_edit(
            branch_id, execution_id, checkpoint_id, found, actor, owner.name
        )
        store = self.actions.pauses.checkpointer_of(owner)
        try:
            with project_scope(project), self.actions.keep_alive(claim.decision.id):
                await off_loop(
                    _write_edited_origin,
                    store,
                    runner,
                    checkpoint_id,
                    execution_id,
                    branch_id,
                    loaded,
                )
                if context is None:
                    result = await runner.aresume(branch_id)
                else:
                    result = await runner.aresume(branch_id, context=context)
        except LocalUIError:
            await off_loop(self.actions.decisions.release, claim.decision.id)
            raise
        except Exception as exc:
            from fastaiagent.chain.checkpoint import write_run_end_once

            error = f"{type(exc).__name__}: {exc}"
            failure = exc
            if await off_loop(store.get_last, branch_id) is not None:
                # The branch exists: it ends, as every run the SDK forks does.
                await off_loop(
                    lambda: write_run_end_once(
                        store,
                        execution_id=branch_id,
                        chain_name=runner.name,
                        status="failed",
                        error=failure,
                        agent_path=runner._agent_path_label,  # the SDK's own label
                    )
                )
                finished = await off_loop(
                    self.actions.decisions.finish, claim.decision.id, "failed", error
                )
                return Outcome(
                    execution_id,
                    "edit",
                    "failed",
                    None,
                    error,
                    finished,
                    new_execution_id=branch_id,
                )
            await off_loop(self.actions.decisions.finish, claim.decision.id, "failed", error)
            return Outcome(execution_id, "edit", "failed", None, error, None)
        status = "paused" if result.status == "paused" else "completed"
        output = result_text(result.output)
        finished = await off_loop(self.actions.decisions.finish, claim.decision.id, status, output)
        return Outcome(
            execution_id, "edit", "forked", output, None, finished, new_execution_id=branch_id
        )

    async def _fork_chain_edited(
        self,
        chain: Any,
        execution_id: str,
        checkpoint_id: str,
        state: dict[str, Any],
        found: tuple[edits.StateChange, ...],
        actor: str,
        project: str | None,
        context: Any | None,
    ) -> Outcome:
        # ``Chain.afork`` names the branch itself, so the record follows the fork.
        extra = {} if context is None else {"context": context}
        try:
            with project_scope(project):
                result = await chain.afork(
                    execution_id, checkpoint_id=checkpoint_id, modified_state=state, **extra
                )
        except Exception as exc:
            return Outcome(
                execution_id, "edit", "failed", None, f"{type(exc).__name__}: {exc}", None
            )
        branch_id = str(result.execution_id)
        claim = await self._record_edit(
            branch_id, execution_id, checkpoint_id, found, actor, chain.name
        )
        status = "paused" if result.status == "paused" else result.status or "completed"
        output = result_text(result.output)
        finished = await off_loop(self.actions.decisions.finish, claim.decision.id, status, output)
        return Outcome(
            execution_id, "edit", "forked", output, None, finished, new_execution_id=branch_id
        )


def _loaded_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The edited conversation as the SDK will load it, with every call answered.

    Loaded with the SDK's own message model (a shape it cannot load is a 400 here, not
    a failure after the branch exists), then balanced as ``Agent.afork`` balances a
    branch's conversation: a call with no result is answered with the SDK's note and
    not run. Written back in the SDK's own serialised shape."""
    from fastaiagent.agent.agent import FORK_SKIPPED_NOTE
    from fastaiagent.agent.executor import _deserialize_messages, _serialize_messages
    from fastaiagent.llm.message import balance_tool_messages
    from pydantic import ValidationError

    try:
        loaded = _deserialize_messages(messages)
    except (ValidationError, ValueError, TypeError) as exc:
        first = str(exc).splitlines()
        raise BadRequest(f"the SDK cannot load this conversation: {' '.join(first[:3])}") from exc
    return _serialize_messages(balance_tool_messages(loaded, note=FORK_SKIPPED_NOTE))


def _write_edited_origin(
    store: Any,
    runner: Any,
    checkpoint_id: str,
    execution_id: str,
    branch_id: str,
    messages: list[dict[str, Any]],
) -> None:
    """The branch's ``__fork_origin__`` row, as ``Agent.afork`` writes it (the SDK's own
    choice of base row, its node index, its lineage link) with the edited conversation."""
    from fastaiagent.chain.checkpoint import Checkpoint, latest_forkable

    base = latest_forkable(store, execution_id, checkpoint_id=checkpoint_id)
    if base is None or base.checkpoint_id != checkpoint_id:
        raise Refused(f"the SDK would not branch from row {checkpoint_id!r} of this run")
    store.put(
        Checkpoint(
            checkpoint_id=str(uuid.uuid4()),
            parent_checkpoint_id=base.checkpoint_id or None,
            chain_name=runner.name,
            execution_id=branch_id,
            node_id=FORK_ORIGIN_NODE,
            node_index=base.node_index,
            step_type=FORK_ORIGIN_STEP,
            status="completed",
            state_snapshot={**base.state_snapshot, "messages": messages},
            agent_path=base.agent_path,
        )
    )
