"""SQL shared by the stores that must filter on run state inside the database."""

from __future__ import annotations

#: Run state in SQL over the newest row ``l`` and the pending row ``p``: the same
#: rules as ``localui.runs.run_state`` (a test holds the two together).
STATE_SQL = """CASE
    WHEN l.step_type = 'run_end' AND l.status = 'failed' THEN 'failed'
    WHEN l.step_type = 'run_end' THEN 'completed'
    WHEN l.status = 'interrupted' AND p.execution_id IS NOT NULL THEN 'paused'
    WHEN l.status = 'interrupted' THEN 'orphaned'
    ELSE 'unfinished'
END"""
