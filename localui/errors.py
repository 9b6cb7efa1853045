"""Typed errors, each mapped once to an HTTP status by the app."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localui.records import Decision


class LocalUIError(Exception):
    """Base for errors that a person should read; ``str(exc)`` is the message, and
    ``details`` what a script reads beside it (JSON answers carry it)."""

    status_code = 500
    title = "Something went wrong"

    def __init__(self, message: str = "", *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details


class BadRequest(LocalUIError):
    status_code = 400
    title = "Bad request"


class NotFound(LocalUIError):
    status_code = 404
    title = "Not found"


def no_such_run(execution_id: str, *, listed: bool = False, param: str = "") -> NotFound:
    """A run the store has no rows of. ``listed``: the runs index still lists it, so it
    was there and its rows were deleted since (a prune, another program); the index
    drops it once it has caught up, which after a prune of a large store is a rebuild
    of a minute or more, with the runs list read from the old index meanwhile."""
    prefix = f"{param}: " if param else ""
    if listed:
        return NotFound(
            f"{prefix}run {execution_id!r} is no longer in this store: its rows were deleted"
            " (a prune, or another program) after the runs list was read. The list drops"
            " it once it has caught up with the store."
        )
    return NotFound(f"{prefix}no run with execution id {execution_id!r} in this store")


class ReadOnly(LocalUIError):
    status_code = 403
    title = "Read-only"


class Forbidden(LocalUIError):
    """The person's role does not allow this action."""

    status_code = 403
    title = "Refused"


class Conflict(LocalUIError):
    status_code = 409
    title = "Conflict"


class AlreadyDecided(Conflict):
    """409 with who decided and when."""

    def __init__(self, message: str, decision: Decision | None) -> None:
        super().__init__(message)
        self.details = {"decision": decision} if decision is not None else None
        self.decision = decision


class StaleCard(Conflict):
    """409: the person saw another row than the one now waiting."""

    def __init__(self, message: str, current_checkpoint_id: str | None) -> None:
        super().__init__(message)
        self.details = {"current_checkpoint_id": current_checkpoint_id}
        self.current_checkpoint_id = current_checkpoint_id


class NeedsConfirmation(Conflict):
    """409: the run's newest row is recent, so it may still be running elsewhere."""


class Unavailable(LocalUIError):
    """The store cannot be read right now: missing, locked, or its server is down."""

    status_code = 503
    title = "Store unavailable"


class StoreMissing(LocalUIError):
    """The store named at start-up does not exist; the CLI prints this in one line."""

    status_code = 503
    title = "Store not found"


class Refused(LocalUIError):
    """The action cannot work here, and was not tried: nothing was claimed or changed."""

    status_code = 422
    title = "Cannot do that here"


class LifespanNotRun(RuntimeError):
    """A request reached localui before its lifespan ran: a programming error of the
    app that mounts it, so it is raised, never answered as a page."""

    def __init__(self) -> None:
        # Starlette runs only the outermost app's lifespan: a parent that mounts
        # localui must enter localui's (see ``localui.app.lifespan_of``).
        super().__init__(
            "localui's lifespan has not run: the app that mounts it must enter "
            "localui.app.lifespan_of(app) in its own lifespan"
        )
