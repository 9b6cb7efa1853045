"""The settings one app process runs with."""

from __future__ import annotations

from dataclasses import dataclass

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``create_app`` needs to know; built by the CLI or a test."""

    #: A SQLite file path, or a ``postgresql://`` URL.
    store: str
    host: str = "127.0.0.1"
    port: int = 8765
    #: Hide every action and refuse them on the server with 403.
    read_only: bool = False
    #: Extra ``Host`` names to accept besides loopback and ``host`` itself.
    allowed_hosts: tuple[str, ...] = ()
    #: How often the change feed looks at the store, in seconds.
    poll_interval: float = 0.5
    #: PostgreSQL schema holding the SDK's tables.
    pg_schema: str = "fastaiagent"
    #: PostgreSQL schema of the app's own table (``localui_decisions``), made on first use.
    pg_app_schema: str = "localui"
    page_size: int = 50
    #: The path prefix a reverse proxy strips before it forwards (``--root-path``):
    #: links and redirects put it back. Mounted in a parent app, the mount sets it.
    root_path: str = ""

    @property
    def host_names(self) -> frozenset[str]:
        """``Host`` header names this server answers to."""
        names = set(LOOPBACK_NAMES) | set(self.allowed_hosts)
        if self.host not in ("0.0.0.0", "::", ""):
            names.add(self.host)
        return frozenset(names)
