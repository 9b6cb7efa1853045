"""A parent Starlette app with localui mounted at /ops/localui, served by uvicorn.

``python playwright_tests/mounted_app.py --store local.db --port 8123``: the browser
test of the mounted app starts this as its server, the way a user embeds localui
(README, "Embed it in your app"), with the demo's refund-bot registered so the
approvals act.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator

PREFIX = "/ops/localui"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True, help="the sign-in token of its owner")
    args = parser.parse_args()
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "false"
    os.environ["FASTAIAGENT_LOCAL_DB"] = args.store

    import uvicorn
    from fastaiagent.checkpointers import SQLiteCheckpointer
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from localui.app import create_app, lifespan_of
    from localui.demo.agent import build_agent
    from localui.settings import Settings, SignIn

    checkpointer = SQLiteCheckpointer(args.store)
    settings = Settings(store=args.store, sign_in=SignIn(token=args.token, owner="Mounted Owner"))
    ui = create_app(settings, agents=[build_agent(checkpointer)])

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with lifespan_of(ui):
            yield

    async def home(request: object) -> PlainTextResponse:
        return PlainTextResponse("the parent app")

    app = Starlette(routes=[Route("/", home), Mount(PREFIX, app=ui)], lifespan=lifespan)
    print(f"serving {args.store} at http://127.0.0.1:{args.port}{PREFIX}/", flush=True)
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=2
    )
    checkpointer.close()


if __name__ == "__main__":
    main()
