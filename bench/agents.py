"""The runners ``localui serve --agents bench/agents.py:refund_bot bench/agents.py:audit_chain``
registers for the benchmark.

The demo's refund-bot, the agent the copied agent runs name, and the audit chain the
copied chain names: with them registered the pages take the path a user's
server takes (preflight of each approval against the agent's tools, a chain's node
order on its run page) rather than the shorter "not registered" one. Both write
through one checkpointer on the served store, as the runners of one project do.
"""

from __future__ import annotations

import os
from functools import cache

from fastaiagent import Agent, Chain
from fastaiagent.checkpointers import Checkpointer, SQLiteCheckpointer

from bench.traced import build_audit_chain
from localui.demo.agent import build_agent


@cache
def _checkpointer() -> Checkpointer:
    dsn = os.environ.get("LOCALUI_BENCH_PG_DSN")
    if dsn:
        # The bench serves a PostgreSQL store: the runners write where it reads.
        from fastaiagent.checkpointers.postgres import PostgresCheckpointer

        schema = os.environ.get("LOCALUI_BENCH_PG_SCHEMA", "fastaiagent")
        return PostgresCheckpointer(dsn, schema=schema, max_pool_size=2)
    # ``localui serve`` sets this to the served store before it imports agents.
    return SQLiteCheckpointer(os.environ["FASTAIAGENT_LOCAL_DB"])


def refund_bot() -> Agent:
    return build_agent(_checkpointer())


def audit_chain() -> Chain:
    return build_audit_chain(_checkpointer())
