"""The store's URL as both services' settings take it (`database_url`):
"memory://" for an in-memory store, else a SQL URL that
coordinator.store.engine accepts."""

from __future__ import annotations

MEMORY_URL = "memory://"


def check_database_url(value: str) -> str:
    """A `database_url` setting: MEMORY_URL as is, a SQL URL normalized
    (coordinator.store.engine.normalize_url, password kept); ValueError with
    the reason otherwise. SQLAlchemy is imported only to check a SQL URL, so
    reading settings does not load it."""
    if value == MEMORY_URL:
        return value
    from coordinator.store.engine import normalize_url
    from coordinator.store.errors import StoreError

    try:
        return normalize_url(value).render_as_string(hide_password=False)
    except StoreError as exc:
        raise ValueError(str(exc)) from None


def serves_replicas(url: str) -> bool:
    """Whether several coordinator processes may share the store at `url`:
    PostgreSQL only (D90). SQLite serves one process; "memory://" is the
    process's own."""
    return url.startswith("postgresql")
