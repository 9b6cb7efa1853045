"""Personal decision links: what scanners do with them, and how fast a person decides.

    .venv/bin/python -m bench --only links                      # SQLite
    .venv/bin/python -m bench --only links --backend postgres   # a PostgreSQL of its own
    .venv/bin/python -m bench.links --backend postgres     # on LOCALUI_TEST_PG_DSN
    .venv/bin/python -m bench.links --fetches 300 --decisions 20   # a quick look

A store of its own gets ``--decisions`` + 1 payout-bot pauses (``bench.crash_agent``,
written by the real SDK); ``localui serve`` runs on it with sign-in on and the
payout-bot registered, and one person, ada, has an address of her own: Apprise's
``json://`` to a receiver here. Her links are the ones the server sends her.

- **Scanners**: the links are fetched ``--fetches`` times in all, in turn, a third each
  by a headless Chromium that opens them and runs their scripts (as mail gateways do),
  by GET and by HEAD (as link checkers and chat unfurlers do). Budget: 0 runs decided
  (each pause is still waiting afterwards).
- **The decision page**: ``GET`` of a link's page, p50 over ``--requests`` (HTML, one
  request after another). Budget: 15 ms.
- **From the click to the run resumed**: each other pause is decided by its link as a
  person does it: the page is opened, then Approve is pressed (a POST of its form), and
  the time is taken from the press until the run is completed in the store (the answer
  comes once the SDK has resumed it: ``localui`` resumes in process). Budget: p95 2 s
  (offline model).

The table goes to ``--out`` (default ``bench/results/links-BACKEND.md``), the raw
figures beside it (``.json``). Exits 0 when every budget is met, 1 when one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import crash_agent
from bench.receiver import Receiver
from bench.servers import REPO, clean_env, free_port

AGENTS = f"{REPO / 'bench' / 'crash_agent.py'}:payout_bot"
LINK = re.compile(r"(https?://\S+/decide/(\S+?)/\S+)")
HIDDEN = re.compile(r'type="hidden" name="(\w+)" value="([^"]*)"')
PAGE_BUDGET_MS = 15.0
CLICK_BUDGET_S = 2.0


def _store(dsn: str | None, workdir: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """The store's ``serve`` arguments, the environment the payout-bot reads, and the
    PostgreSQL schemas to drop afterwards."""
    env = clean_env(
        FASTAIAGENT_TRACE_ENABLED="false",
        CRASH_LEDGER=str(workdir / "ledger.jsonl"),
        XDG_CACHE_HOME=str(workdir / "cache"),
    )
    if dsn is None:
        path = workdir / "local.db"
        env.update(CRASH_STORE=str(path), FASTAIAGENT_LOCAL_DB=str(path))
        return ["--store", str(path)], env, []
    suffix = f"{os.getpid()}_{random.randrange(10**6)}"
    schemas = [f"links_{suffix}", f"links_ui_{suffix}"]
    env.update(CRASH_STORE=dsn, CRASH_SCHEMA=schemas[0])
    return ["--store", dsn, "--pg-schema", schemas[0], "--pg-app-schema", schemas[1]], env, schemas


def _pauses(env: dict[str, str], count: int) -> list[str]:
    # payout-bot finds its store in the environment; this process's is put back after.
    keys = ("CRASH_STORE", "CRASH_LEDGER", "CRASH_SCHEMA")
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: env[k] for k in keys if k in env})
    agent = crash_agent.payout_bot()
    sdk: Any = agent._checkpointer  # the SDK keeps it here and offers no accessor
    sdk.setup()
    try:
        return [asyncio.run(crash_agent.pause(agent, f"L{i}")) for i in range(count)]
    finally:
        sdk.close()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _add_ada(store_args: list[str], env: dict[str, str], address: str) -> str:
    """ada, an approver with an address, as ``localui users add`` makes her; her
    personal token (this script reads the runs' states with it)."""
    # The users table is the app's: ``localui users`` takes no SDK schema.
    where = list(store_args)
    if "--pg-schema" in where:
        at = where.index("--pg-schema")
        del where[at : at + 2]
    done = subprocess.run(
        [sys.executable, "-m", "localui", "users", "add", "ada", "--role", "approver"]
        + [*where, "--notify", address],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"\?token=(\S+)", done.stdout)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"localui users add failed: {done.stderr}")
    return found.group(1)


def _serve(store_args: list[str], env: dict[str, str], workdir: Path) -> tuple[Any, str]:
    port = free_port()
    command = [sys.executable, "-m", "localui", "serve", *store_args, "--agents", AGENTS]
    command += ["--port", str(port)]
    with (workdir / "serve.log").open("wb") as log:  # the child keeps its own copy
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/static/localui.css", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"localui serve did not start: {(workdir / 'serve.log').read_text()}")


def _waiting(client: httpx.Client, run: str) -> bool:
    return bool(client.get(f"/runs/{run}.json").json()["state"] == "paused")


def _shares(fetches: int) -> tuple[int, int, int]:
    """``fetches`` split as evenly as it goes between a script-running browser, GET and
    HEAD, adding up to exactly ``fetches``."""
    each, extra = divmod(fetches, 3)
    return each + (extra > 0), each + (extra > 1), each


def _scan(links: list[str], fetches: int) -> None:
    """``fetches`` fetches of the links, in turn: about a third each by a script-running
    browser, by GET and by HEAD."""
    from playwright.sync_api import sync_playwright

    from bench.browser import CHROMIUM, CHROMIUM_ARGS

    browser_fetches, gets, heads = _shares(fetches)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        try:
            context = browser.new_context()
            page = context.new_page()
            for i in range(browser_fetches):
                page.goto(links[i % len(links)], wait_until="load")
            context.close()
        finally:
            browser.close()
    plain = [link.replace("localui.localhost", "127.0.0.1") for link in links]
    unfurler = {"User-Agent": "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)"}
    with httpx.Client(headers=unfurler) as client:
        for method, count in (("GET", gets), ("HEAD", heads)):
            for i in range(count):
                if client.request(method, plain[i % len(plain)]).status_code != 200:
                    raise SystemExit(f"{method} of a link did not answer 200")


@dataclass
class Figures:
    backend: str
    fetches: int
    decisions: int
    runs_decided_by_scanners: int
    page_ms: list[float]
    click_s: list[float]
    load: tuple[float, float]

    @property
    def page_p50(self) -> float:
        return statistics.median(self.page_ms)

    @property
    def click_p95(self) -> float:
        if len(self.click_s) == 1:
            return self.click_s[0]
        return statistics.quantiles(self.click_s, n=20, method="inclusive")[-1]

    def verdicts(self) -> list[tuple[str, float, float, str]]:
        return [
            (
                f"runs decided by {self.fetches} scanner fetches",
                self.runs_decided_by_scanners,
                0,
                "",
            ),
            ("the decision page p50", self.page_p50, PAGE_BUDGET_MS, " ms"),
            (
                "from the press of Approve to the run resumed p95",
                self.click_p95,
                CLICK_BUDGET_S,
                " s",
            ),
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.links", description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--fetches", type=int, default=1000)
    parser.add_argument("--decisions", type=int, default=40)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None, help="the markdown table's path")
    args = parser.parse_args(argv)
    dsn = os.environ.get("LOCALUI_TEST_PG_DSN") if args.backend == "postgres" else None
    if args.backend == "postgres" and not dsn:
        raise SystemExit("--backend postgres needs LOCALUI_TEST_PG_DSN")
    out = args.out or REPO / "bench" / "results" / f"links-{args.backend}.md"
    return run_links(dsn, out, args.fetches, args.decisions, args.requests)


def run_links(
    dsn: str | None, out: Path, fetches: int = 1000, decisions: int = 40, requests: int = 100
) -> int:
    """The measurement on a store of its own (SQLite, or schemas of their own on the
    PostgreSQL at ``dsn``), its table at ``out`` (raw figures beside it); 0 when every
    budget is met."""
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-links-"))
    store_args, env, schemas = _store(dsn, workdir)
    try:
        figures = _measure(
            "postgres" if dsn else "sqlite", fetches, decisions, requests, workdir, store_args, env
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if dsn is not None and schemas:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return _report(figures, out)


def _report(figures: Figures, out: Path) -> int:
    browser_fetches, gets, heads = _shares(figures.fetches)
    name = "PostgreSQL" if figures.backend == "postgres" else "SQLite"
    lines = [
        f"# Personal decision links ({name})",
        "",
        f"{figures.decisions + 1} payout-bot pauses written by the SDK; `localui serve` with"
        " sign-in on sends ada, an approver with an Apprise `json://` address on loopback,"
        " her own link to each.",
        f"Scanners: {figures.fetches} fetches of the links in turn ({browser_fetches} by a"
        f" headless Chromium that loads the page and runs its scripts, {gets} GET and"
        f" {heads} HEAD with a chat unfurler's agent). The decision page: {len(figures.page_ms)}"
        " GETs one after another. The press: each of "
        f"{len(figures.click_s)} pauses' page opened, then Approve posted, timed from the"
        " press to the run completed in the store (the SDK resumes it in process, on the"
        " offline model).",
        f"Load average at start and end: {figures.load[0]:.1f}, {figures.load[1]:.1f}.",
        "",
        "| budget | limit | measured | result |",
        "|---|---|---|---|",
    ]
    missed = False
    for what, value, limit, unit in figures.verdicts():
        ok = value <= limit
        missed |= not ok
        verdict = "pass" if ok else "**MISSED**"
        lines.append(f"| {what} | ≤ {limit:g}{unit} | {value:.3g}{unit} | {verdict} |")
        print(f"{'ok  ' if ok else 'MISS'} {what}: {value:.3g}{unit} (budget {limit:g}{unit})")
    ms = sorted(figures.page_ms)
    lines += [
        "",
        f"Decision page: p50 {figures.page_p50:.2f} ms, p95"
        f" {ms[int(0.95 * (len(ms) - 1))]:.2f} ms. Press to resumed: p50"
        f" {statistics.median(figures.click_s):.3f} s, p95 {figures.click_p95:.3f} s,"
        f" worst {max(figures.click_s):.3f} s.",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(asdict(figures), indent=2))
    print(f"table at {out}")
    return 1 if missed else 0


def _measure(
    backend: str,
    fetches: int,
    decisions: int,
    requests: int,
    workdir: Path,
    store_args: list[str],
    env: dict[str, str],
) -> Figures:
    load_start = os.getloadavg()[0]
    runs = _pauses(env, decisions + 1)
    print(f"{len(runs)} pauses written ({backend}, load {load_start:.1f})", flush=True)
    with Receiver() as receiver, contextlib.ExitStack() as stack:
        token = _add_ada(store_args, env, f"json://127.0.0.1:{receiver.port}/ada")
        process, url = _serve(store_args, env, workdir)
        try:
            links: dict[str, str] = {}
            deadline = time.monotonic() + 60
            while len(links) < len(runs) and time.monotonic() < deadline:
                for message in receiver.requests("/ada"):
                    links.update({run: u for u, run in LINK.findall(message.json()["message"])})
                time.sleep(0.2)
            if len(links) < len(runs):
                raise SystemExit(f"ada was sent {len(links)} links of {len(runs)}")
            owner = stack.enter_context(
                httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
            )
            started = time.monotonic()
            _scan([links[run] for run in runs], fetches)
            print(f"{fetches} scanner fetches in {time.monotonic() - started:.0f} s", flush=True)
            decided_by_scanners = sum(1 for run in runs if not _waiting(owner, run))

            page_ms: list[float] = []
            with httpx.Client() as person:
                plain = {
                    run: u.replace("localui.localhost", "127.0.0.1") for run, u in links.items()
                }
                for i in range(requests + 5):
                    begun = time.perf_counter()
                    answer = person.get(plain[runs[i % len(runs)]])
                    if answer.status_code != 200:
                        raise SystemExit(f"the decision page answered {answer.status_code}")
                    if i >= 5:  # the first few warm the server's caches
                        page_ms.append((time.perf_counter() - begun) * 1000)
                click_s: list[float] = []
                for run in runs[1:]:
                    page = person.get(plain[run])
                    form = dict(HIDDEN.findall(page.text))
                    post = plain[run].split("/decide/", 1)[0] + f"/decide/{run}"
                    begun = time.perf_counter()
                    pressed = person.post(post, data={**form, "decision": "approve"})
                    state = owner.get(f"/runs/{run}.json").json()["state"]
                    click_s.append(time.perf_counter() - begun)
                    if pressed.status_code != 303 or state != "completed":
                        raise SystemExit(f"{run}: answered {pressed.status_code}, run {state}")
        finally:
            process.terminate()
            process.wait(timeout=10)
    return Figures(
        backend,
        fetches,
        decisions,
        decided_by_scanners,
        page_ms,
        click_s,
        (load_start, os.getloadavg()[0]),
    )


if __name__ == "__main__":
    raise SystemExit(main())
