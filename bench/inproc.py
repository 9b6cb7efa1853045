"""In-process timing of the app: ``python -m bench.inproc --store S ...`` (a child process).

Builds the app the way ``localui serve`` does (store opened, demo agent bound,
``create_app``), runs its lifespan, and times each URL read from stdin (a JSON
object of name -> URL) through ``httpx.ASGITransport``: no socket, no uvicorn.
Prints a JSON object of name -> timing on stdout. A child process so the SDK's
cached configuration and the app's memory stay out of the orchestrator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.latency import Timing, failed


async def _time(client: Any, url: str, requests: int, warmup: int) -> Timing:
    """Like ``bench.latency.time_get``, through the ASGI transport; CPU is this process's."""
    for _ in range(warmup):
        response = await client.get(url)
        if response.status_code != 200:
            return failed(f"GET {url} answered {response.status_code}")
    samples: list[float] = []
    cpu = time.process_time()
    for _ in range(requests):
        started = time.perf_counter()
        response = await client.get(url)
        body = response.content
        samples.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            return failed(f"GET {url} answered {response.status_code}")
    cpu_ms = (time.process_time() - cpu) * 1000 / requests
    return Timing(tuple(samples), 200, len(body), cpu_ms=cpu_ms)


#: The start-up token of ``--sign-in session`` and ``--sign-in bearer``.
TOKEN = "bench-start-up-token"


async def _measure(
    store: Path | str,
    urls: dict[str, str],
    requests: int,
    warmup: int,
    sign_in: str = "off",
    pg: tuple[str, str] | None = None,
    policy: Path | None = None,
) -> dict[str, Any]:
    import httpx

    from bench.agents import audit_chain, refund_bot
    from localui.app import create_app
    from localui.backends import open_backend
    from localui.policy import load_policy
    from localui.registry import Registry
    from localui.settings import Settings, SignIn

    pg_schema, pg_app_schema = pg if pg is not None else ("fastaiagent", "localui")
    settings = Settings(
        store=str(store),
        sign_in=SignIn(required=sign_in != "off", token=TOKEN),
        pg_schema=pg_schema,
        pg_app_schema=pg_app_schema,
        policy=load_policy(policy) if policy is not None else None,
    )
    opened = open_backend(settings)
    registry = Registry.build([refund_bot(), audit_chain()], opened.target)
    app = create_app(settings, agents=registry.agents.values(), backend=opened)
    results: dict[str, Any] = {}
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://127.0.0.1:8765"
            ) as client:
                if sign_in == "session":
                    # The sign-in link sets the session cookie every page then carries.
                    signed = await client.get(f"/?token={TOKEN}")
                    assert signed.status_code == 303, signed.status_code
                    # Sent as a plain header, as a browser does: httpx's cookie jar
                    # costs ~0.1 ms a request on the client side, which is not the app's.
                    [(name, value)] = client.cookies.items()
                    client.cookies.clear()
                    client.headers["Cookie"] = f"{name}={value}"
                elif sign_in == "bearer":
                    client.headers["Authorization"] = f"Bearer {TOKEN}"
                for name, url in urls.items():
                    timing = await _time(client, url, requests, warmup)
                    results[name] = timing.as_json()
    finally:
        opened.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inproc")
    parser.add_argument("--store", required=True, help="a SQLite file or a PostgreSQL URL")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--sign-in",
        choices=("off", "session", "bearer"),
        default="off",
        help="Time pages with sign-in off (as the served bench), or signed in by a session"
        " cookie or a Bearer token: what sign-in costs a page.",
    )
    parser.add_argument(
        "--policy", type=Path, default=None, help="time the pages under this approval policy"
    )
    parser.add_argument(
        "--pg-schema",
        nargs=2,
        metavar=("SCHEMA", "APP_SCHEMA"),
        default=None,
        help="--store is a PostgreSQL URL: the SDK's schema and the app's",
    )
    args = parser.parse_args()
    urls = json.loads(sys.stdin.read())
    store: Path | str = args.store
    pg: tuple[str, str] | None = None
    if args.pg_schema is not None:
        pg = (args.pg_schema[0], args.pg_schema[1])
        # The bench's agent binds to the served PostgreSQL store (bench/agents.py).
        os.environ["LOCALUI_BENCH_PG_DSN"] = args.store
        os.environ["LOCALUI_BENCH_PG_SCHEMA"] = pg[0]
    else:
        store = Path(args.store).resolve()
        os.environ["FASTAIAGENT_LOCAL_DB"] = str(store)
    results = asyncio.run(
        _measure(store, urls, args.requests, args.warmup, args.sign_in, pg, args.policy)
    )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
