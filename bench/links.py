"""Personal decision links: what scanners do with them, and how fast a person decides.

    .venv/bin/python -m bench.links                        # SQLite
    .venv/bin/python -m bench.links --backend postgres     # on LOCALUI_TEST_PG_DSN
    .venv/bin/python -m bench.links --fetches 300 --decisions 20   # a quick look

A store of its own gets ``--decisions`` + 1 payout-bot pauses (``bench.crash_agent``,
written by the real SDK); ``localui serve`` runs on it with sign-in on and the
payout-bot registered, and one person, ada, has an address of her own: Apprise's
``json://`` to a receiver here. Her links are the ones the server sends her.

- **Scanners**: the first pause's link is fetched ``--fetches`` times, a third each by a
  headless Chromium that opens it and runs its scripts (as mail gateways do), by GET
  and by HEAD (as link checkers and chat unfurlers do). Budget: 0 decisions.
- **The decision page**: ``GET`` of a link's page, p50 over ``--requests`` (HTML, one
  request after another). Budget: 15 ms.
- **From the click to the run resumed**: each other pause is decided by its link as a
  person does it: the page is opened, then Approve is pressed (a POST of its form), and
  the time is taken from the press until the run is completed in the store (the answer
  comes once the SDK has resumed it: ``localui`` resumes in process). Budget: p95 2 s
  (offline model).

Exits 0 when every budget is met, 1 when one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
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
    os.environ.update({k: env[k] for k in ("CRASH_STORE", "CRASH_LEDGER") if k in env})
    if "CRASH_SCHEMA" in env:
        os.environ["CRASH_SCHEMA"] = env["CRASH_SCHEMA"]
    agent = crash_agent.payout_bot()
    sdk: Any = agent._checkpointer  # the SDK keeps it here and offers no accessor
    sdk.setup()
    try:
        return [asyncio.run(crash_agent.pause(agent, f"L{i}")) for i in range(count)]
    finally:
        sdk.close()


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
    log = (workdir / "serve.log").open("wb")
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


def _scan(link: str, fetches: int) -> None:
    """A third of ``fetches`` as a script-running browser, a third each GET and HEAD."""
    from playwright.sync_api import sync_playwright

    from bench.browser import CHROMIUM, CHROMIUM_ARGS

    each = max(fetches // 3, 1)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        try:
            context = browser.new_context()
            page = context.new_page()
            for _ in range(each):
                page.goto(link, wait_until="load")
            context.close()
        finally:
            browser.close()
    plain = link.replace("localui.localhost", "127.0.0.1")
    unfurler = {"User-Agent": "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)"}
    with httpx.Client(headers=unfurler) as client:
        for method in ("GET", "HEAD"):
            for _ in range(each):
                if client.request(method, plain).status_code != 200:
                    raise SystemExit(f"{method} of the link did not answer 200")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.links", description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--fetches", type=int, default=1000)
    parser.add_argument("--decisions", type=int, default=40)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args(argv)
    dsn = os.environ.get("LOCALUI_TEST_PG_DSN") if args.backend == "postgres" else None
    if args.backend == "postgres" and not dsn:
        raise SystemExit("--backend postgres needs LOCALUI_TEST_PG_DSN")
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-links-"))
    store_args, env, schemas = _store(dsn, workdir)
    try:
        return _measure(args, workdir, store_args, env)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if dsn is not None and schemas:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _measure(
    args: argparse.Namespace, workdir: Path, store_args: list[str], env: dict[str, str]
) -> int:
    runs = _pauses(env, args.decisions + 1)
    print(f"{len(runs)} pauses written ({args.backend}, load {os.getloadavg()[0]:.1f})", flush=True)
    with Receiver() as receiver:
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
            owner = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
            scanned = runs[0]
            started = time.monotonic()
            _scan(links[scanned], args.fetches)
            print(f"{args.fetches} scanner fetches in {time.monotonic() - started:.0f} s")
            decided_by_scanners = 0 if _waiting(owner, scanned) else 1

            page_ms: list[float] = []
            with httpx.Client() as person:
                plain = {
                    run: u.replace("localui.localhost", "127.0.0.1") for run, u in links.items()
                }
                for i in range(args.requests + 5):
                    begun = time.perf_counter()
                    answer = person.get(plain[runs[1 + i % args.decisions]])
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
    page_p50 = statistics.median(page_ms)
    click_p95 = statistics.quantiles(click_s, n=20)[-1] if len(click_s) > 1 else click_s[0]
    verdicts = [
        (f"decisions from {args.fetches} scanner fetches", decided_by_scanners, 0, ""),
        ("the decision page p50", page_p50, PAGE_BUDGET_MS, " ms"),
        ("from the click to the run resumed p95", click_p95, CLICK_BUDGET_S, " s"),
    ]
    missed = False
    for what, value, limit, unit in verdicts:
        ok = value <= limit
        missed |= not ok
        print(f"{'ok  ' if ok else 'MISS'} {what}: {value:.3g}{unit} (budget {limit:g}{unit})")
    print(f"load {os.getloadavg()[0]:.1f}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
