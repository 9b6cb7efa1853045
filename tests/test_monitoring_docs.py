"""The monitoring doc's dashboard and alert rules ask only for metrics ``/metrics``
really exposes: a renamed metric fails here, not on a team's wall of graphs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from conftest import ActingClientFactory, Ledger, Seeded
from helpers import card, decide
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: A metric name in PromQL: ``localui_`` and what follows (functions and labels are
#: not named so).
METRIC = re.compile(r"\blocalui_[a-z_]+\b")


def exposed_names(client: TestClient) -> set[str]:
    """Every sample name the server exposes (``_bucket``, ``_total`` and all)."""
    text = client.get("/metrics").text
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def dashboard_queries() -> list[str]:
    board = json.loads((DOCS / "grafana-localui.json").read_text())
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def alert_queries(text: str) -> list[str]:
    rules = yaml.safe_load(text)
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def doc_alert_block() -> str:
    doc = (DOCS / "monitoring.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)
    return next(b for b in blocks if "groups:" in b)


def test_the_dashboard_and_alerts_name_only_exposed_metrics(
    store_copy: Path, ledger: Ledger, make_acting_client: ActingClientFactory, seeded: Seeded
) -> None:
    client = make_acting_client(store_copy, ledger)
    # A request, and a decision, so the request timer and the decision record have
    # something to expose.
    paused = seeded.id("paused-1")
    assert decide(client, paused, card(client, paused)["checkpoint_id"]).status_code == 200
    exposed = exposed_names(client)
    queries = dashboard_queries() + alert_queries((DOCS / "prometheus-alerts.yml").read_text())
    named = {name for q in queries for name in METRIC.findall(q)}
    assert named, "the dashboard and the alerts name no metric"
    assert named <= exposed, f"named but not exposed: {sorted(named - exposed)}"
    # The doc's copy of the rules is the file's.
    assert alert_queries(doc_alert_block()) == alert_queries(
        (DOCS / "prometheus-alerts.yml").read_text()
    )
    # The two alerts the doc promises: a pause over an hour, stalled runs.
    alerts = alert_queries((DOCS / "prometheus-alerts.yml").read_text())
    assert "max(localui_oldest_pause_age_seconds) > 3600" in alerts
    assert "max(localui_stalled_runs) > 0" in alerts
