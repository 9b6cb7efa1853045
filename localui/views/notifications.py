"""``/notifications``: what was announced, and how each target's deliveries went.

For operators: it names the targets (their URLs with secrets masked) and the
errors they answered with.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from localui.auth import OPERATOR, require
from localui.backends.notifications import FAILED, Notification, TargetStatus
from localui.notify.targets import mask_urls
from localui.notify.watcher import Watcher
from localui.offloop import off_loop
from localui.views.respond import html_only, nav_ahead, respond
from localui.views.state import context
from localui.views.urls import Urls, urls_of

#: Announcements the page lists, newest first.
RECENT = 100


def _instant(stamp: float | None) -> str | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC).isoformat()


@dataclass(frozen=True, slots=True)
class TargetRow:
    id: str
    #: ``chat`` (Apprise: one message per poll) or ``webhook`` (one signed POST per event).
    kind: str
    label: str
    sent: int
    pending: int
    failed: int
    last_sent_at: str | None
    last_error: str | None
    #: What it is told: ``every event``, or the pauses under an approval policy's rules.
    gets: str = "every event"


@dataclass(frozen=True, slots=True)
class AnnouncementRow:
    event_type: str
    execution_id: str
    target: str
    state: str
    attempts: int
    recorded_at: str
    sent_at: str | None
    next_at: str | None
    last_error: str | None
    run_url: str = html_only("")
    #: The state as people read it: a row ``failed`` was given up on (its error says why).
    state_words: str = html_only("")


@dataclass(frozen=True, slots=True)
class NotificationsPage:
    #: Whether this server was started with any ``--notify`` or ``--webhook`` target.
    configured: bool
    events: tuple[str, ...]
    #: When the watcher last looked at every waiting pause (None: not yet since start).
    last_sweep_at: str | None
    targets: tuple[TargetRow, ...]
    recent: tuple[AnnouncementRow, ...]
    #: How far the runs index's first build has got (%), while it postpones the sweeps.
    index_percent: int | None = None


def _row(n: Notification, urls: Urls) -> AnnouncementRow:
    return AnnouncementRow(
        event_type=n.event_type,
        execution_id=n.execution_id,
        # Rows recorded before targets were masked, for a target no longer configured,
        # still hold the path: shown masked all the same.
        target=mask_urls(n.target),
        state=n.state,
        state_words="given up" if n.state == FAILED else n.state,
        attempts=n.attempts,
        recorded_at=_instant(n.created_at) or "",
        sent_at=_instant(n.sent_at),
        next_at=_instant(n.next_at) if n.state == "pending" else None,
        last_error=mask_urls(n.last_error) if n.last_error else None,
        run_url=urls.run(n.execution_id),
    )


def build_notifications_page(watcher: Watcher | None, urls: Urls) -> NotificationsPage:
    if watcher is None:
        return NotificationsPage(
            configured=False, events=(), last_sweep_at=None, targets=(), recent=()
        )
    statuses: dict[str, TargetStatus] = {s.target: s for s in watcher.outbox.target_statuses()}
    targets = []
    for target in watcher.targets:
        status = statuses.get(target.id)
        targets.append(
            TargetRow(
                id=target.id,
                kind=target.kind,
                label=target.label,
                sent=status.sent if status else 0,
                pending=status.pending if status else 0,
                failed=status.failed if status else 0,
                last_sent_at=_instant(status.last_sent_at) if status else None,
                last_error=mask_urls(status.last_error) if status and status.last_error else None,
                gets=watcher.gets(target.id),
            )
        )
    return NotificationsPage(
        configured=True,
        events=watcher.notifications.events,
        last_sweep_at=_instant(watcher.swept_at),
        targets=tuple(targets),
        recent=tuple(_row(n, urls) for n in watcher.outbox.list_recent(RECENT)),
        index_percent=building.percent if (building := watcher.index_building) else None,
    )


async def notifications_page(request: Request) -> Response:
    require(request, OPERATOR)
    ctx = context(request)
    nav_ahead(request)
    page = await off_loop(build_notifications_page, ctx.watcher, urls_of(request))
    return await respond(request, "pages/notifications.html", page)
