"""Counting the SQL statements a site process runs, on every database connection (the agent socket's own threads
included): what a test asserts when a path must reach no database."""

from __future__ import annotations

from django.db import connection
from django.db.backends.signals import connection_created

from marketplace.realtime import dbthreads


class Statements:
    """SQL statements run on any database connection of this process (the agent socket's thread included)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)

    def watch(self, sender, connection, **kwargs) -> None:
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)

    def install(self) -> None:
        connection_created.connect(self.watch, weak=False)
        self.watch(None, connection)  # the thread it is called on
        dbthreads.on_each_thread(lambda: self.watch(None, connection))  # the ones the socket's database calls run on

    def uninstall(self) -> None:
        connection_created.disconnect(self.watch)
        dbthreads.on_each_thread(self._unwatch)
        self._unwatch()

    def _unwatch(self) -> None:
        if self in connection.execute_wrappers:
            connection.execute_wrappers.remove(self)
