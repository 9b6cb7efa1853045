"""``/metrics``: the exposition of :mod:`localui.metrics`'s registry."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from localui.offloop import off_loop
from localui.views.state import context


async def metrics_page(request: Request) -> Response:
    """The exposition. Who may read it the sign-in middleware decided: anyone signed
    in, a scraper with the token of ``--metrics-token-file``, or anyone with sign-in off."""
    ctx = context(request)
    body = await off_loop(generate_latest, ctx.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
