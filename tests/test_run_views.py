"""The run page's sections: what the verdict line counts, and the row window's links."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def test_the_verdict_counts_every_row_of_a_run_longer_than_the_timeline(
    make_client: Any, store_copy: Path, raw: Any, page_text: Callable[..., str]
) -> None:
    base = raw(store_copy)
    # Hand-built: the SDK writes runs this long only after hours of turns.
    for i in range(450):
        base.insert_checkpoint(
            id=f"long-{i:03d}",
            chain_name="refund-bot",
            execution_id="long run/2",
            checkpoint_id=f"long-{i:03d}",
            node_id=f"turn:{i // 2}" + ("/tool:refund" if i % 2 else ""),
            step_type="tool_call" if i % 2 else "llm_call",
            created_at=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}+00:00",
        )
    client = make_client(store_copy)
    html = client.get("/runs/long~20run~2F2").text
    # The timeline shows 200 of them; the line under the title counts the run.
    assert "· 450 rows" in page_text(html, "run-state")
    assert "Rows 251–450 of 450." in page_text(html, "timeline")
    assert 'href="/runs/long~20run~2F2?from=50#timeline"' in html
    assert 'href="/runs/long~20run~2F2?from=0&amp;rows=all#timeline"' in html
    assert client.get("/runs/long~20run~2F2?from=0&rows=all").status_code == 200
