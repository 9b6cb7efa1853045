"""``GET /runs/{execution_id}/bundle``: the run as one file (see ``localui.bundle``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from localui.bundle import build_bundle
from localui.offloop import off_loop
from localui.views.state import context


async def run_bundle(request: Request) -> Response:
    ctx = context(request)
    execution_id = request.path_params["execution_id"]
    keys = request.query_params.getlist("redact")
    data = await off_loop(
        lambda: build_bundle(
            ctx.store,
            [execution_id],
            decisions=ctx.actions.decisions,
            traces=ctx.traces,
            redact_keys=keys,
            notes=ctx.actions.notes,
        )
    )
    # The file name is for the person saving it: keep only safe characters.
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in execution_id)[:80]
    return Response(
        data,
        media_type="application/gzip",
        headers={
            "Content-Disposition": f'attachment; filename="{safe}.localui.gz"',
            "Cache-Control": "no-store",
        },
    )
