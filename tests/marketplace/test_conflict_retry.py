"""A transaction PostgreSQL aborts for a real deadlock runs again, instead of the agent hearing an error."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections, transaction

from marketplace.services.base import retry_conflicts

from . import factories

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_victim_of_a_deadlock_runs_again_and_both_transactions_commit():
    if connection.vendor != "postgresql":
        pytest.skip("deadlock detection is PostgreSQL's")
    x, y = factories.user(), factories.user()
    x_locked, y_locked, attempts, other = threading.Event(), threading.Event(), [], []

    def the_other_agent():  # locks x, then y: the opposite order
        try:
            with transaction.atomic():
                User.objects.select_for_update().get(pk=x.pk)
                x_locked.set()
                assert y_locked.wait(10)
                time.sleep(0.3)  # the victim waits first: PostgreSQL aborts it when its deadlock_timeout fires
                User.objects.select_for_update().get(pk=y.pk)
                User.objects.filter(pk=y.pk).update(first_name="other")
            other.append("committed")
        finally:
            connections.close_all()

    @retry_conflicts
    @transaction.atomic
    def install():  # locks y, then x
        attempts.append(1)
        if len(attempts) == 1:
            assert x_locked.wait(10)
        User.objects.select_for_update().get(pk=y.pk)
        y_locked.set()
        User.objects.select_for_update().get(pk=x.pk)
        User.objects.filter(pk=x.pk).update(first_name="install")

    thread = threading.Thread(target=the_other_agent)
    thread.start()
    install()
    thread.join(20)

    assert len(attempts) == 2 and other == ["committed"]
    assert User.objects.get(pk=x.pk).first_name == "install" and User.objects.get(pk=y.pk).first_name == "other"
