"""Server processes under test: ``localui serve`` and the SDK's ``fastaiagent ui``.

Each starts from a scratch working directory with a clean environment for the
SDK (no ``FASTAIAGENT_*`` variables leak in from the caller), and is timed from
just before ``Popen`` to its first 200 on ``/``. Resident memory comes from
``/proc/PID/status``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
#: The runners localui registers (see ``bench/agents.py``).
AGENTS_SPECS = tuple(
    f"{REPO / 'bench' / 'agents.py'}:{name}" for name in ("refund_bot", "audit_chain")
)
#: A server that has not answered 200 by then has failed to start.
START_TIMEOUT_S = 180.0
#: A first start on a million runs indexes them in the background: waited for this long.
INDEX_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without the SDK's settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTAIAGENT_")}
    env.update(extra)
    return env


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    base_url: str
    workdir: Path
    log_path: Path
    #: Seconds from just before ``Popen`` to the first 200 on ``/``.
    startup_s: float = 0.0
    #: CPU the process had used by then: start-up cost whatever else the machine does.
    startup_cpu_s: float = 0.0
    #: ``time.perf_counter()`` just before ``Popen``.
    started_at: float = 0.0
    notes: list[str] = field(default_factory=list)

    def memory_kb(self) -> dict[str, int]:
        """``VmRSS`` (resident now) and ``VmHWM`` (peak resident) of the server process."""
        values: dict[str, int] = {}
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0])
        return values

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (all its threads)."""
        with open(f"/proc/{self.proc.pid}/stat") as stat:
            # The command name may hold spaces: count fields after its closing paren.
            fields = stat.read().rsplit(")", 1)[1].split()
        utime, stime = int(fields[11]), int(fields[12])
        return (utime + stime) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


#: A start is timed once the machine's other work is below this share of its CPUs
#: (what a person starting the server meets), or after ``QUIET_WAIT_S`` regardless.
QUIET_BELOW = 0.15
QUIET_WAIT_S = 15.0


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far, from ``/proc/stat``."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def wait_until_quiet(window: float = 0.5) -> float:
    """Wait until the machine's CPUs are mostly idle over ``window`` seconds (what a
    process stopped just before, a browser closing or a cache being written leave
    behind); how long it waited. A start timed beside that measures the neighbour."""
    began = time.perf_counter()
    while time.perf_counter() - began < QUIET_WAIT_S:
        busy, total = _cpu_times()
        time.sleep(window)
        busy_after, total_after = _cpu_times()
        if (busy_after - busy) < QUIET_BELOW * max(1, total_after - total):
            break
    return time.perf_counter() - began


#: A server is idle below this share of one core over ``IDLE_WINDOW_S``.
IDLE_BELOW = 0.05
IDLE_WINDOW_S = 1.0
#: A server still busy after this long is timed as it is (the wait is logged).
IDLE_WAIT_S = 300.0


def wait_until_idle(server: Server) -> float:
    """Wait until ``server`` spends under 5 % of a core over a second; how long it
    waited. After a first start a server works on its own for a while (the trace index
    of a store with spans, folded in the background from the first runs list on): pages
    timed beside that work measured it too (a run page's server CPU above its p50)."""
    began = time.perf_counter()
    while time.perf_counter() - began < IDLE_WAIT_S:
        before = server.cpu_seconds()
        time.sleep(IDLE_WINDOW_S)
        if server.cpu_seconds() - before < IDLE_BELOW * IDLE_WINDOW_S:
            break
    return time.perf_counter() - began


def _start(
    name: str,
    command: list[str],
    *,
    port: int,
    env: dict[str, str],
    workdir: Path,
    quiet: bool = False,
    ready: str = "/",
) -> Server:
    if quiet:
        wait_until_quiet()
    log_path = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    log = open(log_path, "wb")  # noqa: SIM115  (the child holds it for its life)
    base_url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    server = Server(name=name, proc=proc, base_url=base_url, workdir=workdir, log_path=log_path)
    server.started_at = started
    deadline = started + START_TIMEOUT_S
    with httpx.Client(timeout=60.0) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode} before answering: {server.log_tail()}"
                )
            try:
                if client.get(f"{base_url}{ready}").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.perf_counter() > deadline:
                server.stop()
                raise RuntimeError(f"{name} gave no 200 on {ready} within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.005)
    server.startup_s = time.perf_counter() - started
    server.startup_cpu_s = server.cpu_seconds()
    return server


#: How often the bench asks whether the runs index is complete: four times as often as
#: the runs page asks while it says "indexing" (every second). Asking every 20 ms took
#: the server's attention from the build it was timing: 42 s rather than 27 s at a
#: million runs on SQLite, whose build folds rows in Python beside the requests.
INDEX_POLL_S = 0.25


def wait_until_indexed(server: Server) -> float:
    """Seconds from ``server``'s start until its runs list answers from the complete
    runs index (a large store's first start indexes it in the background), to within
    :data:`INDEX_POLL_S`."""
    deadline = time.perf_counter() + INDEX_TIMEOUT_S
    with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        while client.get("/runs.json").json().get("indexing") is not None:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the runs index was not ready within {INDEX_TIMEOUT_S:.0f} s")
            time.sleep(INDEX_POLL_S)
    return time.perf_counter() - server.started_at


def wait_until_search_indexed(server: Server, pg: PgTarget) -> float:
    """Seconds from ``server``'s start until the runs index's trigram index is made (a
    first build in chunks makes it once the runs list is complete)."""
    import psycopg

    from localui.backends.postgres.index.schema import Tables

    meta = Tables(app_schema=pg.app_schema, store_schema=pg.schema).meta
    deadline = time.perf_counter() + INDEX_TIMEOUT_S
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        while conn.execute(f"SELECT 1 FROM {meta} WHERE key = 'search_index_pending'").fetchone():
            if time.perf_counter() > deadline:
                raise RuntimeError(f"no trigram index within {INDEX_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
    return time.perf_counter() - server.started_at


def wait_until_sqlite_search_indexed(server: Server, store: Path, cache_dir: Path) -> float:
    """Seconds from ``server``'s start until the SQLite runs index's trigram index is
    complete (a background build fills it once the runs list is complete)."""
    from localui.backends.sqlite.index import schema

    index_file = schema.index_path(store.resolve(), cache_dir / "localui")
    deadline = time.perf_counter() + INDEX_TIMEOUT_S
    with closing(sqlite3.connect(f"file:{index_file}?mode=ro", uri=True)) as conn:
        while not schema.text_complete(conn):
            if time.perf_counter() > deadline:
                raise RuntimeError(f"no trigram index within {INDEX_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
    return time.perf_counter() - server.started_at


def pythonpath(app_path: Path | None) -> str:
    """``PYTHONPATH`` for a child: the localui at ``app_path`` (a scratch copy being
    tried out) ahead of this checkout's, then this checkout for ``bench``."""
    return os.pathsep.join(str(p) for p in (app_path, REPO) if p is not None)


#: A bare Python that imports the agent module ``--agents`` names, as ``localui serve``
#: would (once), builds its runners, and says how much it holds resident.
_AGENT_ALONE = """
import importlib.util, sys
modules, runners = {}, []
for named in sys.argv[1:]:
    path, attr = named.rsplit(":", 1)
    if path not in modules:
        spec = importlib.util.spec_from_file_location("bench_agents_alone", path)
        modules[path] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[path])
    runners.append(getattr(modules[path], attr)())
with open("/proc/self/status") as status:
    print(next(line.split()[1] for line in status if line.startswith("VmRSS:")))
"""


def agent_alone_rss_kb(
    store: Path, *, app_path: Path | None = None, pg: PgTarget | None = None
) -> int:
    """VmRSS of a bare Python holding only the agent module localui is started with and
    its runners: what they cost in any process, so localui's share is its RSS minus this.
    With ``pg``, the agent is built as localui builds it there: on the SDK's
    PostgreSQL checkpointer (whose driver and pool it imports)."""
    extra = {}
    if pg is not None:
        extra = {"LOCALUI_BENCH_PG_DSN": pg.dsn, "LOCALUI_BENCH_PG_SCHEMA": pg.schema}
    env = clean_env(
        FASTAIAGENT_LOCAL_DB=str(store),
        FASTAIAGENT_TRACE_ENABLED="false",
        PYTHONPATH=pythonpath(app_path),
        **extra,
    )
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-agent-"))
    done = subprocess.run(
        [sys.executable, "-c", _AGENT_ALONE, *AGENTS_SPECS],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True, slots=True)
class PgTarget:
    """A store on PostgreSQL: the SDK's schema, and the app's (its runs index); with
    ``traces``, the SQLite file whose spans the fleet's agents wrote (``--traces``)."""

    dsn: str
    schema: str
    app_schema: str
    traces: Path | None = None


def start_localui(
    store: Path,
    *,
    cache_dir: Path,
    agents: bool = True,
    app_path: Path | None = None,
    pg: PgTarget | None = None,
    policy: Path | None = None,
    notify: Sequence[str] = (),
    quiet: bool = False,
    sign_in: bool = False,
    port: int | None = None,
) -> Server:
    """``python -m localui serve`` on ``store`` (or on ``pg``'s schema); its own files
    (the SQLite runs index) go to ``cache_dir`` through ``XDG_CACHE_HOME``, so a fresh
    dir means a cold start (on PostgreSQL, a fresh app schema does). ``policy``: served
    under that approval policy (``--policy``); ``notify``: the notification options it
    is given (``--webhook``, ``--notify`` …), so its watcher runs; ``quiet``: started
    once the machine is quiet (:func:`wait_until_quiet`), for a start that is timed;
    ``sign_in``: with sign-in on (people need links of their own, ``localui users add``);
    ``port``: on that port (a replica started again where its balancer expects it)."""
    port = free_port() if port is None else port
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-serve-"))
    where = [str(store)]
    extra: dict[str, str] = {}
    if pg is not None:
        where = [pg.dsn, "--pg-schema", pg.schema, "--pg-app-schema", pg.app_schema]
        # The bench's agent binds to this store (bench/agents.py).
        extra = {"LOCALUI_BENCH_PG_DSN": pg.dsn, "LOCALUI_BENCH_PG_SCHEMA": pg.schema}
        if pg.traces is not None:
            where += ["--traces", str(pg.traces)]
    command = [sys.executable, "-m", "localui", "serve", "--store", *where, "--port", str(port)]
    if not sign_in:
        # Pages are timed as a page's work; what sign-in adds is measured in process.
        command.append("--no-auth")
    if agents:
        command += ["--agents", *AGENTS_SPECS]
    if policy is not None:
        command += ["--policy", str(policy)]
    command += list(notify)
    env = clean_env(XDG_CACHE_HOME=str(cache_dir), PYTHONPATH=pythonpath(app_path), **extra)
    # With sign-in on, every page but the static files wants a session.
    ready = "/static/localui.css" if sign_in else "/"
    return _start("localui", command, port=port, env=env, workdir=workdir, quiet=quiet, ready=ready)


def start_sdk_ui(store: Path, *, venv: Path) -> Server:
    """``fastaiagent ui --db STORE --no-auth --no-open`` from the SDK UI's own venv."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="localui-bench-sdkui-"))
    command = [
        str(venv / "bin" / "fastaiagent"),
        "ui",
        "--db",
        str(store),
        "--no-auth",
        "--no-open",
        "--port",
        str(port),
    ]
    # HOME: its auth file and any other per-user state stay in the scratch dir.
    env = clean_env(HOME=str(workdir))
    return _start("sdk-ui", command, port=port, env=env, workdir=workdir)
