"""150 concurrent requests on PostgreSQL: no server error, and the site's connections stay under its pool's cap.
Before the pool each of daphne's request threads opened a connection of its own and kept it
for CONN_MAX_AGE: the burst took the server's every connection and the late requests got 500s ("too many
clients"); ``bench/bench_db_burst.py`` shows both, on a private server.

A real daphne on a fresh database of the test suite's PostgreSQL (dropped after); SQLite has no connections to
exhaust, so this test needs ``DATABASE_URL=postgres://...``.
"""

from __future__ import annotations

import os

import pytest

from bench.bench_db_burst import Database, run_row

DATABASE_URL = os.environ.get("DATABASE_URL", "")
POOL_MAX = 10

pytestmark = [pytest.mark.skipif(not DATABASE_URL.startswith(("postgres://", "postgresql://")),
                                 reason="PostgreSQL only (DATABASE_URL=postgres://...)"),
              pytest.mark.timeout(600)]


def test_a_burst_of_150_requests_queues_for_the_pool(tmp_path, redis_url):
    admin_url = DATABASE_URL.rpartition("/")[0] + "/postgres"
    row = run_row(Database(admin_url, f"echo2_burst_test_{os.getpid()}"), redis_url, pool_max=POOL_MAX,
                  requests=150, workdir=tmp_path)
    assert row["5xx"] == 0, row
    assert (row["ok"], row["4xx"]) == (100, 50), row  # the owner's requests answered, the wrong tokens a 401 each
    assert 0 < row["peak"] <= POOL_MAX, row
