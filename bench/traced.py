"""Write traced template runs: ``python -m bench.traced STORE``.

The demo agent runs in this process with tracing on, so the SDK writes its
spans into ``STORE`` beside the checkpoints, as it does in a user's project.
Run it from a scratch working directory: the SDK also writes
``.fastaiagent/config.toml`` there. Prints one JSON line per run:
``{"kind": ..., "execution_id": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

#: One traced run per shape the benchmark copies spans for.
PROMPTS = {
    "completed": "Refund order A-1001 for 40.00",
    "paused": "Refund order A-1002 for 250.00",
}


async def _run(store: Path) -> None:
    from fastaiagent import SQLiteCheckpointer

    from localui.demo.agent import build_agent

    checkpointer = SQLiteCheckpointer(str(store))
    agent = build_agent(checkpointer)
    try:
        for kind, prompt in PROMPTS.items():
            execution_id = str(uuid.uuid4())
            result = await agent.arun(prompt, execution_id=execution_id)
            if result.status != kind:
                raise SystemExit(f"traced {kind} run ended {result.status}")
            print(json.dumps({"kind": kind, "execution_id": execution_id}), flush=True)
    finally:
        checkpointer.close()


def main() -> int:
    store = Path(sys.argv[1]).resolve()
    # The SDK reads these once, on first use: set them before importing it.
    os.environ["FASTAIAGENT_TRACE_ENABLED"] = "true"
    os.environ["FASTAIAGENT_LOCAL_DB"] = str(store)
    asyncio.run(_run(store))
    from fastaiagent.trace import otel

    # Spans are exported in batches: make sure the last ones are in the file.
    provider = getattr(otel, "_provider", None)
    if provider is not None:
        provider.force_flush()
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
