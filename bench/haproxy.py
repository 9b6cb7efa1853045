"""A real HAProxy in front of several ``localui serve`` replicas, on loopback.

Round-robin, no sticky sessions, as a team would run it (README, "Run it for a team"):
each request may land on any replica, so whatever a person's next click needs (the
session, a preview's signature, the decision record) must come through the store.
Each answer names the replica that gave it (``X-Localui-Replica``), so a test can tell
that both served. A replica that stops answering is taken out after two failed
health checks (half a second apart), and a request whose connection it refused is
sent to another.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

#: Debian's package puts it here (scripts/setup.sh installs it).
HAPROXY = "/usr/sbin/haproxy"
#: The response header that names the replica that answered.
REPLICA_HEADER = "X-Localui-Replica"

CONFIG = """\
global
    maxconn 512

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    # A live page's event stream stays open; the app sends a comment every few seconds.
    timeout tunnel 1h
    retries 2
    option redispatch
    # Only a connection refused is tried on another replica: never a request one took.
    retry-on conn-failure

frontend desk
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk
    # With a Host: the replicas' Host allowlist refuses a request without one.
    http-check send meth GET uri /static/localui.css ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1
    http-response set-header {header} %[srv_name]
{servers}
"""


def haproxy_path() -> str:
    found = shutil.which("haproxy") or (HAPROXY if Path(HAPROXY).exists() else None)
    if found is None:
        raise RuntimeError("no haproxy (Debian's package: scripts/setup.sh installs it)")
    return found


def config(port: int, replicas: Sequence[tuple[str, str]]) -> str:
    """The configuration for ``replicas`` as (name, ``host:port``) behind ``port``."""
    servers = "\n".join(f"    server {name} {address} check" for name, address in replicas)
    return CONFIG.format(port=port, header=REPLICA_HEADER, servers=servers)


@dataclass
class Balancer:
    """``with Balancer(port, replicas, workdir) as lb``: HAProxy listening on ``port``
    until the block ends; ``replicas``: (name, ``host:port``)."""

    port: int
    replicas: Sequence[tuple[str, str]]
    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Balancer:
        path = self.workdir / "haproxy.cfg"
        path.write_text(config(self.port, self.replicas))
        checked = subprocess.run(
            [haproxy_path(), "-c", "-q", "-f", str(path)], capture_output=True, text=True
        )
        if checked.returncode != 0:
            raise RuntimeError(f"haproxy refused its configuration: {checked.stderr}")
        self._log = (self.workdir / "haproxy.log").open("wb")
        # -db: in the foreground, so it ends with this process's signal.
        self.process = subprocess.Popen(
            [haproxy_path(), "-db", "-f", str(path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(self.url + "/static/localui.css", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"haproxy did not answer: {self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        if self._log is not None and not self._log.closed:
            self._log.flush()
        log = self.workdir / "haproxy.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
