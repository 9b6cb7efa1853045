"""What a server holds: memory its requests free goes back to the OS, and agents
load through the SDK's own import, untouched."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import LOOPBACK_CLIENT, NO_SIGN_IN

from localui.app import create_app
from localui.memory import (
    ReleaseFreedMemory,
    keep_thresholds,
    release_due,
    release_freed_memory,
)
from localui.settings import Settings

BASE_URL = "http://127.0.0.1:8765"
PAGE = mmap.PAGESIZE

on_glibc = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="malloc's knobs are glibc's own"
)


@on_glibc
def test_freed_pages_between_live_blocks_go_back_when_released() -> None:
    assert keep_thresholds()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = 64 * 1024

    def in_ram(pages: set[int]) -> set[int]:
        """The pages mincore(2) finds in RAM (an unmapped page is not)."""
        found = set()
        flag = ctypes.c_ubyte()
        for page in pages:
            if libc.mincore(page, PAGE, ctypes.byref(flag)) == 0 and flag.value & 1:
                found.add(page)
        return found

    # Blocks under the mmap threshold come from the heap, and one stays live after
    # them, as a page's long-lived neighbour does: freeing the others leaves a hole
    # below it, which free() alone keeps in RAM.
    blocks = [libc.malloc(size) for _ in range(256)]
    neighbour = libc.malloc(size)
    try:
        inside: set[int] = set()
        for block in blocks:
            ctypes.memset(block, 1, size)
            first = -(-block // PAGE) * PAGE
            inside.update(range(first, (block + size) // PAGE * PAGE, PAGE))
        for block in blocks:
            libc.free(block)
        kept = in_ram(inside)
        assert kept, "free() returned the whole hole by itself"
        assert release_freed_memory()
        # A free chunk keeps the page holding its header; the rest goes.
        assert len(in_ram(kept)) < len(kept) // 10
    finally:
        libc.free(neighbour)


def test_memory_goes_back_at_first_and_then_each_time_it_has_grown_by_a_step() -> None:
    mb = 1024 * 1024
    assert release_due(90 * mb, None, 2 * mb)
    assert not release_due(80 * mb + mb, 80 * mb, 2 * mb)
    assert release_due(82 * mb, 80 * mb, 2 * mb)
    assert not release_due(70 * mb, 80 * mb, 2 * mb)


@on_glibc
def test_pages_are_the_same_through_the_middleware_which_releases_after_requests(
    app_store: Path,
) -> None:
    from starlette.testclient import TestClient  # after conftest silenced its import warning

    # A step no page grows by: only the first request releases.
    settings = Settings(store=str(app_store), sign_in=NO_SIGN_IN)
    app = ReleaseFreedMemory(create_app(settings), step_bytes=1 << 40)
    plain = create_app(settings)
    with (
        TestClient(app, base_url=BASE_URL, client=LOOPBACK_CLIENT) as client,
        TestClient(plain, base_url=BASE_URL, client=LOOPBACK_CLIENT) as raw,
    ):
        # The lifespan ran (the pages need its store), and released nothing.
        assert app.releases == 0 and app.resident_after_release is None
        for url in ("/runs.json", "/approvals.json", "/", "/runs/no-such-run"):
            response, expected = client.get(url), raw.get(url)
            assert response.status_code == expected.status_code
            assert response.headers["content-type"] == expected.headers["content-type"]
            if url.endswith(".json"):
                assert response.json() == expected.json()
            assert app.releases == 1
    assert app.resident_after_release is not None


def test_agents_load_with_the_sdk_as_it_imports_itself(tmp_path: Path) -> None:
    # A process of its own: this one has pytest and the SDK imported already.
    script = """
import json, os, sys
from localui.registry import load_spec
agents = load_spec(os.environ["SPEC"])
from_sdk = "pytest" in sys.modules
print(json.dumps({"agents": [a.name for a in agents], "from_sdk": from_sdk}))
"""
    env = {
        **os.environ,
        "SPEC": f"{Path(__file__).parent.parent / 'bench' / 'agents.py'}:refund_bot",
        "FASTAIAGENT_LOCAL_DB": str(tmp_path / "local.db"),
        "FASTAIAGENT_TRACE_ENABLED": "false",
    }
    seen = probe(tmp_path, script, env=env)
    assert seen["agents"] == ["refund-bot"]
    # The SDK imports its pytest plugin where pytest is installed, and localui lets it.
    assert seen["from_sdk"]


def probe(cwd: Path, script: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """What ``script`` printed as JSON on its last line, run in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


DEEPDIFF_PROBE = """
import json, sys, threading
if sys.argv[1] == "pydantic first":
    import pydantic
from localui.diff import diff_section
assert "deepdiff" not in sys.modules  # loaded by the first diff that needs it
a, b = json.loads(sys.argv[2]), json.loads(sys.argv[3])
found = {}
# The first diff in a thread of its own, as a server's first diff page makes it.
worker = threading.Thread(
    target=lambda: found.update(changes=repr(diff_section("state_snapshot", a, b).changes))
)
worker.start()
worker.join()
import deepdiff.helper
seen = {
    "pydantic_loaded": "pydantic" in sys.modules and sys.modules["pydantic"] is not None,
    "stand_in": deepdiff.helper.PydanticBaseModel.__module__ == "deepdiff.helper",
    "changes": found["changes"],
}
import pydantic  # kept out of DeepDiff only: the process can still import it
seen["importable"] = pydantic.BaseModel.__name__ == "BaseModel"
print(json.dumps(seen))
"""

KEPT_OUT_PROBE = """
import json, sys, threading
from localui.diff import _kept_out_of_this_thread
assert "pydantic" not in sys.modules
seen = {}
with _kept_out_of_this_thread("pydantic"):
    try:
        import pydantic
        seen["here"] = "imported"
    except ImportError as exc:
        seen["here"] = str(exc)
    elsewhere = threading.Thread(
        target=lambda: seen.update(elsewhere=__import__("pydantic").BaseModel.__name__)
    )
    elsewhere.start()
    elsewhere.join()
seen["finders_left"] = sum(type(f).__name__ == "_KeptOutOfThread" for f in sys.meta_path)
print(json.dumps(seen))
"""

#: Values only DeepDiff compares (lists of objects whose values are not all scalars).
NESTED_A = {"orders": [{"id": "A-1", "lines": [{"sku": 1, "qty": 2}]}, {"id": "A-2"}], "n": 1}
NESTED_B = {"orders": [{"id": "A-1", "lines": [{"sku": 1, "qty": 3}]}], "n": 1, "note": "x"}


@pytest.mark.parametrize("first", ["nothing first", "pydantic first"])
def test_a_servers_deepdiff_leaves_pydantic_out_unless_it_is_loaded_and_diffs_the_same(
    tmp_path: Path, first: str
) -> None:
    """DeepDiff is imported by the first diff that needs it (``localui serve`` loads it
    at start, the same way); where nothing has loaded pydantic (a viewer with no agents)
    it comes without it, 3.7 MB less resident, and finds the same changes as with it."""
    from localui.diff import diff_section

    seen = probe(tmp_path, DEEPDIFF_PROBE, first, json.dumps(NESTED_A), json.dumps(NESTED_B))
    if first == "nothing first":
        assert not seen["pydantic_loaded"] and seen["stand_in"]
    else:
        assert seen["pydantic_loaded"] and not seen["stand_in"]
    # This process has pydantic (the SDK imports it): its DeepDiff is the usual one.
    here = repr(diff_section("state_snapshot", NESTED_A, NESTED_B).changes)
    assert "qty" in here and "A-2" in here
    assert seen["changes"] == here
    assert seen["importable"]


def test_pydantic_is_kept_out_of_the_thread_that_loads_deepdiff_only(tmp_path: Path) -> None:
    """While a first diff loads DeepDiff without pydantic, another thread (an agent's
    models, a request of its own) imports pydantic as ever: a ``None`` in
    ``sys.modules`` would have refused it too."""
    seen = probe(tmp_path, KEPT_OUT_PROBE)
    assert seen == {
        "here": "No module named 'pydantic'",
        "elsewhere": "BaseModel",
        "finders_left": 0,
    }
