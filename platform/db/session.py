"""The database handle: one SQLAlchemy engine and its session factory per app.

Sessions are synchronous; the API runs them in the thread pool (sync dependencies and routes),
never on the event loop, so a slow query cannot stall token streaming.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

# One pooled connection per worker thread: FastAPI's sync dependencies and `anyio.to_thread`
# share anyio's default limit of 40 threads. A smaller pool makes threads wait for, or open and
# close, connections on every request under load (a quarter of the API's CPU in a profile of a
# 384-request burst on SQLite). On PostgreSQL that is up to 50 connections per server process:
# its max_connections (100 by default) must leave room for them.
POOL_SIZE = 40
MAX_OVERFLOW = 10


def create_db_engine(url: str) -> Engine:
    """An engine for `url`; SQLite files get WAL, a busy timeout and foreign keys."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(
            url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=MAX_OVERFLOW
        )
    pool_args: dict[str, Any] = {}
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        pool_args = {"pool_size": POOL_SIZE, "max_overflow": MAX_OVERFLOW}
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": 30}, **pool_args
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return engine


class Database:
    """Owns the engine; hands out short-lived sessions."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_db_engine(url)
        self.session_factory = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.session_factory() as session:
            yield session

    def ping(self) -> None:
        """Raises if the database cannot answer a trivial query."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()
