"""Telling people when a run needs them: events, their durable outbox, the sender.

- ``events``: which events a change in the store or a sweep of it gives (pure).
- ``formats``: the person-readable message and the webhook body of an event (pure).
- ``targets``: the configured Apprise and webhook targets, checked at start.
- ``sender``: delivers what the outbox holds, with retries and backoff.
- ``watcher``: records events from the change feed and the sweeps, and runs the sender.

The outbox itself (``localui_notifications``) belongs to the backends
(``localui.backends.notifications`` and one class per backend).
"""
