"""localui inside your own Starlette app, at /ops/localui: ``uvicorn embed:app``."""

import contextlib
import os

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from localui.app import create_app, lifespan_of
from localui.settings import Settings

store = os.environ.get("FASTAIAGENT_LOCAL_DB", ".fastaiagent/local.db")
# agents=[...] as for `localui serve --agents`, to approve and resume from here too.
# Sign-in stays on: people open the links that
# `localui users add NAME --role approver --url https://YOUR-HOST/ops/localui/` prints.
ui = create_app(Settings(store=store))


@contextlib.asynccontextmanager
async def lifespan(app):
    # Starlette runs only the outermost app's lifespan: enter localui's in yours,
    # or its pages have no store to read.
    async with lifespan_of(ui):
        yield


async def home(request):
    return PlainTextResponse("my app")


app = Starlette(
    routes=[Route("/", home), Mount("/ops/localui", app=ui)],
    lifespan=lifespan,
)
