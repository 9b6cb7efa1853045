"""The agent ``localui serve --agents bench/agents.py:refund_bot`` registers for the benchmark.

The demo's refund-bot, the agent every copied run names: with it registered the
pages take the path a user's server takes (preflight of each approval against
the agent's tools) rather than the shorter "no agent registered" one.
"""

from __future__ import annotations

import os

from fastaiagent import Agent
from fastaiagent.checkpointers import SQLiteCheckpointer

from localui.demo.agent import build_agent


def refund_bot() -> Agent:
    dsn = os.environ.get("LOCALUI_BENCH_PG_DSN")
    if dsn:
        # The bench serves a PostgreSQL store: the agent writes where it reads.
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        schema = os.environ.get("LOCALUI_BENCH_PG_SCHEMA", "fastaiagent")
        return build_agent(PostgresCheckpointer(dsn, schema=schema, max_pool_size=2))
    # ``localui serve`` sets this to the served store before it imports agents.
    return build_agent(SQLiteCheckpointer(os.environ["FASTAIAGENT_LOCAL_DB"]))
