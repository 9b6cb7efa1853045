"""A first look at a large store: the runs list answers at once while the store is
indexed, says so, and fills in by itself when the index is ready.

The store is built the way the benchmark builds them (real SDK rows copied under
new ids) with enough rows to be indexed in the background. Its index is built
once and marked as built for another file, as if the store had been replaced, and
this test holds the index file's write lock (as a second localui building the
same index would) until the page has been checked, so the page is certainly
opened while indexing.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT
from helpers import start_localui
from playwright.sync_api import Page, expect

from localui.backends.sqlite.index import BACKGROUND_FROM_ROWS
from localui.backends.sqlite.store import SQLiteStore
from localui.records import RunQuery

#: Runs in the store: with the benchmark's long runs, over BACKGROUND_FROM_ROWS rows.
RUNS = 5000
#: The page asks again every second; this only bounds a broken page's wait.
FILL_TIMEOUT_MS = 20_000

BUILD = """
import sys
from pathlib import Path
from bench.stores import build_store, make_templates
templates = make_templates(Path(sys.argv[2]), lambda line: None)
build_store(templates, Path(sys.argv[1]), runs=int(sys.argv[3]), pending=10)
"""


def test_the_runs_page_fills_in_when_the_index_is_ready(page: Page, tmp_path: Path) -> None:
    store = tmp_path / "large.db"
    subprocess.run(
        [sys.executable, "-c", BUILD, str(store), str(tmp_path / "templates"), str(RUNS)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=True,
        timeout=300,
    )
    with sqlite3.connect(store) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    assert rows >= BACKGROUND_FROM_ROWS

    cache = tmp_path / "cache"
    indexed = SQLiteStore(store, index_dir=cache / "localui")
    indexed.totals()  # waits for the index
    runs = sum(indexed.list_runs(RunQuery()).counts.values())
    assert runs == RUNS
    index_file = indexed._index.path
    indexed.close()
    with sqlite3.connect(index_file) as conn:
        conn.execute("UPDATE meta SET value = 'another file' WHERE key = 'identity'")

    holder = sqlite3.connect(index_file, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        server = start_localui(
            ["serve", "--store", str(store), "--no-auth"],
            cwd=tmp_path,
            log=tmp_path / "serve.log",
            env={**os.environ, "XDG_CACHE_HOME": str(cache)},
            ready="/",
            timeout=60,
        )
    except BaseException:
        holder.execute("ROLLBACK")
        holder.close()
        raise
    url = server.url
    try:
        try:
            page.goto(url + "/")
            notice = page.locator("p.indexing")
            expect(notice).to_contain_text(f"Indexing this store's {rows:,} rows")
            expect(page.locator("table.runs tbody tr")).to_have_count(50)
            expect(page.locator(".tab .count")).to_have_count(0)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        # Waited for by what comes, not by the notice going: while htmx swaps the
        # section in for the next ask, the notice is briefly gone though the index is
        # not ready yet.
        expect(page.locator("p.totals")).to_contain_text(
            f"{rows} rows in the store", timeout=FILL_TIMEOUT_MS
        )
        expect(notice).to_have_count(0)
        expect(page.locator(".tab.state-all .count")).to_have_text(str(runs))
        expect(page.locator("a[rel=next]")).to_have_count(1)
    finally:
        server.stop()
