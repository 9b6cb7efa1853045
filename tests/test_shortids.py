"""The one rule for showing ids where there is no room for them whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hypothesis import given
from hypothesis import strategies as st

from localui.shortids import shortest_unique

if TYPE_CHECKING:
    from conftest import ClientFactory


def test_an_id_of_sixteen_characters_or_fewer_is_shown_whole() -> None:
    ids = ["run-pending-a", "run-pending-b", "run-pending-c", "run-failed", "refund-1042", "x"]
    assert shortest_unique(ids) == {i: i for i in ids}
    assert shortest_unique(["sixteen-chars-ok"]) == {"sixteen-chars-ok": "sixteen-chars-ok"}


def test_a_longer_id_is_cut_to_at_least_eight_characters() -> None:
    run = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"
    assert shortest_unique([run]) == {run: "3f2a9c1e"}
    assert shortest_unique([run], at_least=12) == {run: "3f2a9c1e-5b7"}


def test_look_alike_prefixes_are_lengthened_until_they_read_apart() -> None:
    a = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"
    b = "3f2a9c1e-5b7e-0000-0000-000000000000"
    c = "77777777-0000-0000-0000-000000000000"
    shown = shortest_unique([a, b, c])
    assert shown == {a: "3f2a9c1e-5b7d", b: "3f2a9c1e-5b7e", c: "77777777"}


def test_a_short_id_shown_whole_is_not_the_start_of_a_long_one_shown_cut() -> None:
    short = "run-pending-abcd"
    long = "run-pending-abcd-retry-2"
    shown = shortest_unique([short, long])
    assert shown[short] == short
    assert shown[long] == "run-pending-abcd-"


def test_an_id_that_starts_another_is_shown_whole() -> None:
    inner = "run-pending-abcdefgh"
    outer = "run-pending-abcdefgh-2"
    shown = shortest_unique([inner, outer])
    assert shown == {inner: inner, outer: "run-pending-abcdefgh-"}


def test_repeats_and_other_limits() -> None:
    run = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert shortest_unique([run, run]) == {run: "aaaaaaaa"}
    assert shortest_unique([]) == {}
    assert shortest_unique(["a-name-of-twenty-ch"], whole_up_to=20) == {
        "a-name-of-twenty-ch": "a-name-of-twenty-ch"
    }


_IDS = st.lists(
    st.one_of(
        st.builds(lambda: str(uuid.uuid4())),
        st.text(alphabet="ab-01", min_size=1, max_size=24),
    ),
    max_size=40,
)


@given(_IDS)
def test_every_shown_id_is_a_prefix_that_names_one_id_only(ids: list[str]) -> None:
    shown = shortest_unique(ids)
    assert set(shown) == set(ids)
    for full, text in shown.items():
        assert full.startswith(text)
        assert len(text) == len(full) if len(full) <= 16 else len(text) >= 8
        others = [o for o in shown if o != full and o.startswith(text)]
        # Unique, unless the id is itself the start of another (then it is shown whole).
        assert not others or text == full
        # The shortest such: one character less would name another id too.
        if len(full) > 16 and len(text) > 8:
            assert any(o != full and o.startswith(text[:-1]) for o in shown)


# --- on the pages: runs the SDK wrote under ids a person chose ----------------------

#: As the SDK's docs name runs: the three pauses read apart only past ``run-pend``.
LOOK_ALIKE_PAUSED = (
    "run-pending-a",
    "run-pending-b",
    "run-pending-c",
    "refund-2026-12-01-0001",
    "refund-2026-12-01-0002",
)
LOOK_ALIKE_FAILED = "run-failed"


def test_pages_show_look_alike_ids_apart(
    copy_store: Callable[[], Path], tmp_path: Path, make_client: ClientFactory
) -> None:
    store = copy_store()
    command = [sys.executable, str(Path(__file__).parent / "odd_id_runs.py"), "--store", str(store)]
    for execution_id in LOOK_ALIKE_PAUSED:
        command += ["--paused", execution_id]
    command += ["--failed", LOOK_ALIKE_FAILED]
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false", "FASTAIAGENT_LOCAL_DB": str(store)}
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    client = make_client(store)
    expected = {
        "run-pending-a": "run-pending-a",
        "run-pending-b": "run-pending-b",
        "run-pending-c": "run-pending-c",
        "run-failed": "run-failed",
        "refund-2026-12-01-0001": "refund-2026-12-01-0001",
        "refund-2026-12-01-0002": "refund-2026-12-01-0002",
    }

    runs_page = client.get("/").text
    approvals_page = client.get("/approvals").text
    for page, ids in (
        (runs_page, expected),
        (approvals_page, {k: v for k, v in expected.items() if k != LOOK_ALIKE_FAILED}),
    ):
        for full, text in ids.items():
            link = re.search(
                rf'title="{re.escape(full)}"><code class="short-id">([^<]*)</code>', page
            )
            assert link is not None, full
            assert link.group(1) == text
    # The runs list copies the full id; the queue keeps to its script budget (the title).
    for full in expected:
        assert f'data-copy="{full}"' in runs_page
    # The SDK's uuids beside them: the shortest prefix unique on the page, 8 or more.
    uuids = re.findall(r'title="([0-9a-f-]{36})"><code class="short-id">([^<]*)<', runs_page)
    assert len(uuids) >= 10
    for full, text in uuids:
        assert full.startswith(text) and len(text) >= 8
    assert len({text for _, text in uuids}) == len(uuids)
