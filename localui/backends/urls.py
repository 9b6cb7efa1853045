"""What a store string names, decided here and nowhere else."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

#: URL schemes libpq accepts; anything else names a SQLite file.
SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(store: str) -> bool:
    """Whether ``store`` names a PostgreSQL database rather than a SQLite file."""
    return store.startswith(SCHEMES)


def redact(dsn: str) -> str:
    """The URL with its password (in the user part or as a parameter) replaced by ``***``."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        if ":" in user:
            user = user.split(":", 1)[0] + ":***"
        netloc = f"{user}@{host}"
    query = re.sub(r"(?i)(^|&)password=[^&]*", r"\1password=***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
