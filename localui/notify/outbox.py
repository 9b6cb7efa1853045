"""An event as the outbox keeps it: a JSON payload, written once and read back once.

The outbox's table and its SQL belong to the backends
(``localui.backends.notifications`` and one class per backend); this is the one
place that turns an :class:`~localui.notify.events.Event` into the row's payload
and back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from localui.backends.notifications import Notice, Notification
from localui.notify.events import Event

_FIELDS = {f.name for f in dataclasses.fields(Event)}
#: Fields held as tuples, which JSON gives back as lists.
_TUPLES = {f.name for f in dataclasses.fields(Event) if isinstance(f.default, tuple)}


def notice_of(event: Event) -> Notice:
    """What the outbox records for ``event``, once per target."""
    payload = json.dumps(dataclasses.asdict(event), ensure_ascii=False, default=str)
    return Notice(
        event_key=event.key,
        event_type=event.type,
        execution_id=event.execution_id,
        payload=payload,
    )


def notices_of(events: Sequence[Event]) -> tuple[Notice, ...]:
    return tuple(notice_of(e) for e in events)


def event_of(notification: Notification) -> Event:
    """The event a row was recorded for; fields a newer localui added are left out."""
    data = json.loads(notification.payload)
    kept: dict[str, Any] = {
        k: tuple(v) if k in _TUPLES else v for k, v in data.items() if k in _FIELDS
    }
    return Event(**kept)
