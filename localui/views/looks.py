"""One look at the runs index per read request (:mod:`localui.backends.looks`)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localui.backends import looks


class OneLookPerRead:
    """Each read request (GET or HEAD) is one look at the runs index until its answer
    starts (:mod:`localui.backends.looks`): its questions bring the index up to date
    once between them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        with looks.one_look() as look:

            async def answering(message: Message) -> None:
                if message["type"] == "http.response.start":
                    # A stream goes on after this: each of its reads looks afresh.
                    look.open = False
                await send(message)

            await self.app(scope, receive, answering)
