"""The web server's database backend: Django's PostgreSQL backend, whose psycopg pool checks every idle
connection as soon as one borrowed connection fails its check.

Why: after a database restart (or ``pg_terminate_backend``) every pooled connection is dead. psycopg's
pool checks a connection before lending it and, when the check fails, waits before the next try (1 s,
2 s, 4 s, …, within the request's 10 s pool timeout) so as not to spin. With eight dead connections
the waits add up past the timeout and the first requests after a restart failed with "couldn't get a
connection after 10.00 sec" (HTTP 500), found by tests/webapp/test_db_pool.py. One failed check almost
always means the others died too, so the check here drops all broken idle connections in one pass
(``ConnectionPool.check``) before the pool's own retry, which then waits on a fresh connection.

Selected by ``webapp/settings.py`` only when the pool is on (``GRUE_DB_POOL=1``, the ASGI server)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base as postgresql
from psycopg_pool import ConnectionPool


def _check_or_sweep(pool: ConnectionPool, conn: Any) -> None:
    """The pool's usual check; on failure, also check (and replace) every idle connection now."""
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        pool.check()
        raise


class DatabaseWrapper(postgresql.DatabaseWrapper):
    """Django's wrapper with the pool built as Django builds it, except for the check callback."""

    @property
    def pool(self) -> ConnectionPool | None:
        options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not options:
            return None
        if self.alias not in self._connection_pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            kwargs = self.get_connection_params()
            kwargs["autocommit"] = True  # as Django: it sets the real mode after borrowing
            pool: ConnectionPool = ConnectionPool(
                kwargs=kwargs,
                open=False,
                configure=self._configure_connection,
                check=lambda conn: _check_or_sweep(pool, conn),
                **(options if isinstance(options, dict) else {}),
            )
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]
