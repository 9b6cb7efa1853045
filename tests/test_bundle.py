"""A run you can hand to someone: export, open elsewhere, the same pages."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ClientFactory, Seeded

from localui.bundle import FORMAT, REDACTED, BundleError, load_bundles, read_bundle

#: "11 s ago" in one app and "12 s ago" in the other is the clock, not the bundle.
_AGO = re.compile(r"\b\d+ (s|min|h|d|days?|hours?) ago\b")


def _without_actions(page: Any) -> Any:
    """A page's JSON minus what only a writable app has (what can be done, not what is),
    with relative ages left out."""
    if isinstance(page, dict):
        return {k: _without_actions(v) for k, v in page.items() if k not in {"actions"}}
    if isinstance(page, list):
        return [_without_actions(v) for v in page]
    if isinstance(page, str):
        return _AGO.sub("some time ago", page)
    return page


def _opened(make_client: ClientFactory, files: list[Path], tmp_path: Path) -> Any:
    store = tmp_path / "opened" / "local.db"
    store.parent.mkdir()
    load_bundles([read_bundle(f) for f in files], store)
    return make_client(store, read_only=True)


def test_every_demo_run_exported_and_opened_shows_the_same_pages(
    make_client: ClientFactory, app_store: Path, seeded: Seeded, tmp_path: Path
) -> None:
    original = make_client(app_store)
    files = []
    for name, run_id in seeded.report.runs.items():
        response = original.get(f"/runs/{run_id}/bundle")
        assert response.status_code == 200, response.text
        assert "attachment" in response.headers["content-disposition"]
        files.append(tmp_path / f"{name}.localui.gz")
        files[-1].write_bytes(response.content)
    opened = _opened(make_client, files, tmp_path)
    pages = ["/runs.json", "/approvals.json"]
    for run_id in seeded.report.runs.values():
        pages.append(f"/runs/{run_id}.json")
        for row in original.get(f"/runs/{run_id}.json").json()["rows"]:
            pages.append(f"/runs/{run_id}/rows/{row['checkpoint_id']}.json")
    for page in pages:
        want = original.get(page)
        got = opened.get(page)
        assert got.status_code == want.status_code == 200, page
        assert _without_actions(got.json()) == _without_actions(want.json()), page
    completed = opened.get(f"/runs/{seeded.id('completed')}.json").json()
    assert completed["trace"]["answer"] == "Done: refunded 40.00 on A-1001."
    # Opened bundles are read-only: no action goes through.
    refused = opened.post(
        f"/runs/{seeded.id('crashed-in-tool')}/resume", headers={"Origin": "http://127.0.0.1:8765"}
    )
    assert refused.status_code == 403


def _values_of(value: Any, key: str) -> list[Any]:
    """Every value of ``key`` in ``value``, JSON text inside strings included."""
    found: list[Any] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key:
                found.append(v)
            found.extend(_values_of(v, key))
    elif isinstance(value, list):
        for v in value:
            found.extend(_values_of(v, key))
    elif isinstance(value, str) and value[:1] in ("{", "["):
        try:
            found.extend(_values_of(json.loads(value), key))
        except ValueError:
            pass
    return found


def test_redacted_bundle_holds_none_of_the_redacted_values(
    make_client: ClientFactory, app_store: Path, seeded: Seeded
) -> None:
    client = make_client(app_store)
    run_id = seeded.id("paused-1")
    plain = json.loads(gzip.decompress(client.get(f"/runs/{run_id}/bundle").content))
    keys = ("order_id", "amount", "tool.args")
    for key in keys:
        assert _values_of(plain, key), f"{key} is in the plain bundle"
    query = "&".join(f"redact={k}" for k in keys)
    redacted = json.loads(gzip.decompress(client.get(f"/runs/{run_id}/bundle?{query}").content))
    assert redacted["redacted_keys"] == sorted(keys)
    for key in keys:
        values = _values_of(redacted, key)
        assert values and all(v == REDACTED for v in values), key
    # A value only ever stored under a redacted key is nowhere in the file.
    plain_text = gzip.decompress(client.get(f"/runs/{run_id}/bundle").content).decode()
    assert "Grace Hopper" in plain_text
    hidden = gzip.decompress(client.get(f"/runs/{run_id}/bundle?redact=customer").content)
    assert b"Grace Hopper" not in hidden
    # The bundle's own structure is untouched: it still opens.
    assert redacted["runs"][0]["execution_id"] == run_id


def test_cli_export_and_open_answer_bad_files_in_one_line(
    seeded: Seeded, app_store: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "FASTAIAGENT_TRACE_ENABLED": "false"}
    target = tmp_path / "run.localui.gz"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "localui",
            "export",
            seeded.id("completed"),
            "-o",
            str(target),
            "--store",
            str(app_store),
            "--redact",
            "amount",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    bundle = read_bundle(target)
    assert all(v == REDACTED for v in _values_of(list(bundle.runs), "amount"))
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "localui",
            "export",
            "no-such-run",
            "-o",
            str(tmp_path / "x"),
            "--store",
            str(app_store),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "no run with execution id" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    truncated = tmp_path / "truncated.localui.gz"
    truncated.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    newer = tmp_path / "newer.localui.gz"
    newer.write_bytes(
        gzip.compress(json.dumps({"format": "localui-bundle", "version": FORMAT + 1}).encode())
    )
    for bad, words in ((truncated, "damaged or truncated"), (newer, "newer localui")):
        opened = subprocess.run(
            [sys.executable, "-m", "localui", "open", str(bad), "--port", "1"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert opened.returncode == 2, opened.stderr
        assert words in opened.stderr and len(opened.stderr.strip().splitlines()) == 1


def test_bundle_with_unknown_columns_is_refused(tmp_path: Path) -> None:
    """Column names come from the file: only the SDK's own ever reach the SQL."""
    bad = tmp_path / "bad.localui.gz"
    run = {"execution_id": "x", "checkpoints": [{"id": "1", "evil) --": 1}]}
    bad.write_bytes(
        gzip.compress(
            json.dumps({"format": "localui-bundle", "version": FORMAT, "runs": [run]}).encode()
        )
    )
    with pytest.raises(BundleError, match="unknown checkpoints columns"):
        load_bundles([read_bundle(bad)], tmp_path / "store.db")
