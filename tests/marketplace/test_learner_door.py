"""The learner's door (docs/trust.md): a Redis user per learner session whose keys are its job's alone, on a private
redis-server (never the machine's own users). With job A's credentials everything the learner does works, and
nothing else does: job B's keys, the site's keys, the channel layer's and Celery's, MONITOR, pub/sub, KEYS, SCAN,
FLUSHALL, ACL, CONFIG, SELECT. A restart of the learner rotates the password (the old one refused, its connections
closed); the job's end deletes the user; a Redis restart that lost the user gets it back at the next heartbeat."""

from __future__ import annotations

from urllib.parse import urlsplit

import kombu
import pytest
import redis
from asgiref.sync import async_to_sync
from rest_framework.test import APIClient

from dataplane import audit_hold, replay
from dataplane.learner_acl import learner_username
from marketplace.infra import stream
from marketplace.models import Job
from marketplace.realtime.channel_layer import ResilientRedisChannelLayer
from tests.groups import group_of
from tests.private_redis import PrivateRedis

from . import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def streams(tmp_path, settings):
    """The site on a private Redis (streams, channel layer and broker on one machine, as in the demo)."""
    server = PrivateRedis(tmp_path).start()
    settings.REDIS_URL = settings.CELERY_BROKER_URL = server.url
    settings.STREAMS_REDIS_URL, settings.STREAMS_PUBLIC_URL, settings.LEARNER_REDIS_USERS = server.url, "", True
    settings.CELERY_TASK_ALWAYS_EAGER = True
    stream.client.cache_clear()
    yield server
    stream.client.cache_clear()
    server.stop()


def owner_api(owner) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    return api


def running_job(owner, api: APIClient) -> Job:
    job = factories.job(owner)
    assert api.post(f"/api/jobs/{job.pk}/start/").status_code == 200
    return job


def door(api: APIClient, job: Job) -> dict:
    reply = api.post(f"/api/jobs/{job.pk}/learner/streams/")
    assert reply.status_code == 200, reply.content
    return reply.json()


def refused(call) -> str:
    """The error Redis answered ``call`` with (it must refuse it)."""
    with pytest.raises(redis.RedisError) as err:
        call()
    return str(err.value)


def _leased_and_returned(job_id: int, *, worker_id: int = 4) -> str:
    """A group returned to the job through the site's own connection (lease, then return: the site's scripts)."""
    site = stream.replay(job_id)
    site.add_prompts(["2+5="])
    [lease] = site.lease(worker_id=worker_id, count=1, timeout_s=60)
    records = [{"job_id": job_id, "lease_id": lease.lease_id, "group_id": lease.group_id, "prompt": lease.prompt,
                "prompt_ids": [1, 5], "completion": "7", "completion_ids": [12, 2], "logprobs": [-1.5, -0.2],
                "reward": 1.0, "version": 0}] * 2
    return site.return_group(worker_id=worker_id, group=group_of(records), seal_key=b"k" * 32)


def test_a_learner_does_all_it_needs_with_its_own_door(streams) -> None:
    owner = factories.user()
    api = owner_api(owner)
    job = running_job(owner, api)
    given = door(api, job)
    assert given["isolated"] is True and given["username"] == learner_username(job.pk) and given["reason"] == ""
    url = urlsplit(given["url"])
    assert (url.scheme, url.port, url.username) == ("redis", streams.port, learner_username(job.pk))
    assert job.transfer_secret not in given["url"] and len(url.password) >= 40

    learner = replay.connect(given["url"], decode_responses=False)
    buffer = replay.ReplayBuffer(learner, job.pk)
    buffer.ensure_groups()
    assert buffer.add_prompts(["3+4=", "1+1="]) == 2  # the prompt feeder (in a transaction)
    entry = _leased_and_returned(job.pk)
    assert buffer.outstanding() == 3  # two prompts waiting, a group returned
    [group] = buffer.read("learner", count=4, block_ms=100)
    assert group.entry_id == entry and buffer.read_pending("learner")[0].entry_id == entry
    assert audit_hold.hold(learner, job.pk, [entry]) == 1  # the audit hold's script
    assert audit_hold.held_workers(learner, job.pk) == {entry: 4}  # what a restarted learner reads back
    assert buffer.ack_counted([(entry, 2)], replay.DROPPED_STALE) == 2  # the counted acknowledgement's script
    buffer.count("quarantined_records", 1)
    assert buffer.counters()["dropped_stale_records"] == 2 and buffer.counters()["accepted_groups"] == 1
    buffer.ack([entry])
    assert set(audit_hold.held_groups(learner, job.pk, [entry])) == {entry}  # the copy outlived the entry
    learner.close()


def test_job_a_learner_reaches_nothing_else(streams) -> None:
    owner = factories.user()
    api = owner_api(owner)
    other = factories.user()
    job_a, job_b = running_job(owner, api), running_job(other, owner_api(other))
    entry_b = _leased_and_returned(job_b.pk)
    site = stream.client()
    audit_hold.hold(site, job_b.pk, [entry_b])
    layer = ResilientRedisChannelLayer(hosts=[streams.url], prefix="echo2")  # the site's channel layer
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("worker.1", channel)
    with kombu.Connection(streams.url) as broker:  # a Celery message waiting in the broker
        broker.SimpleQueue("celery").put({"task": "marketplace.tasks.replan_job", "args": [job_b.pk]})
    site.set("echo2:celery:alive", 1)  # one of the site's own keys beside the streams

    learner = redis.Redis.from_url(door(api, job_a)["url"], decode_responses=True)
    b_trajectories, b_counters = replay.trajectories_key(job_b.pk), replay.counters_key(job_b.pk)
    attempts = {
        "read B's stream": lambda: learner.xreadgroup(replay.LEARNER_GROUP, "x", {b_trajectories: "0"}),
        "read B's stream by range": lambda: learner.xrange(b_trajectories),
        "write B's stream": lambda: learner.xadd(b_trajectories, {"data": "forged"}),
        "trim B's stream": lambda: learner.xtrim(b_trajectories, maxlen=0),
        "acknowledge B's entry": lambda: learner.xack(b_trajectories, replay.LEARNER_GROUP, entry_b),
        "delete B's entry": lambda: learner.xdel(b_trajectories, entry_b),
        "delete B's keys": lambda: learner.delete(b_trajectories, b_counters),
        "count into B": lambda: learner.hincrby(b_counters, "accepted_groups", 100),
        "read B's held copy": lambda: learner.hgetall(audit_hold.held_key(job_b.pk, entry_b)),
        "hold B's entry": lambda: audit_hold.hold(learner, job_b.pk, [entry_b]),
        "B's key in a script": lambda: learner.eval("return redis.call('HGETALL', KEYS[1])", 1, b_counters),
        "B's key undeclared in a script": lambda: learner.eval(
            f"return redis.call('HGETALL', '{b_counters}')", 1, replay.counters_key(job_a.pk)),
        "what A's workers delivered": lambda: learner.hincrby(replay.delivered_key(job_a.pk), "4", 100),
        "the channel layer's groups": lambda: learner.zrange("echo2:group:worker.1", 0, -1),
        "a channel's messages": lambda: learner.delete(channel),
        "Celery's queue": lambda: learner.lpush("celery", "{}"),
        "Celery's bindings": lambda: learner.smembers("_kombu.binding.celery"),
        "the site's keys": lambda: learner.get("echo2:celery:alive"),
        "MONITOR": lambda: learner.execute_command("MONITOR"),
        "PUBLISH": lambda: learner.publish("echo2:group:worker.1", "x"),
        "SUBSCRIBE": lambda: learner.execute_command("SUBSCRIBE", "anything"),
        "PSUBSCRIBE": lambda: learner.execute_command("PSUBSCRIBE", "*"),
        "KEYS *": lambda: learner.keys("*"),
        "SCAN": lambda: learner.scan(0, match="echo2:job:*"),
        "RANDOMKEY": lambda: learner.randomkey(),
        "FLUSHALL": lambda: learner.flushall(),
        "FLUSHDB": lambda: learner.flushdb(),
        "ACL LIST": lambda: learner.acl_list(),
        "ACL SETUSER": lambda: learner.acl_setuser(learner_username(job_a.pk), enabled=True, keys=["*"]),
        "CONFIG GET": lambda: learner.config_get("*"),
        "SELECT": lambda: learner.execute_command("SELECT", "1"),
        "SCRIPT FLUSH": lambda: learner.script_flush(),
        "CLIENT LIST": lambda: learner.client_list(),
        "SHUTDOWN": lambda: learner.execute_command("SHUTDOWN", "NOSAVE"),
    }
    for what, call in attempts.items():
        reason = refused(call)
        assert any(word in reason for word in ("NOPERM", "permission", "can't access")), f"{what}: {reason}"
    learner.close()

    # Nothing of B's or the site's moved.
    assert site.xlen(b_trajectories) == 1 and site.hget(b_counters, "accepted_groups") == "1"
    assert site.llen("celery") == 1 and site.get("echo2:celery:alive") == "1"
    assert site.zcard("echo2:group:worker.1") == 1


def test_a_restarted_learner_gets_a_new_password_and_the_old_one_is_refused(streams) -> None:
    owner = factories.user()
    api = owner_api(owner)
    job = running_job(owner, api)
    first = door(api, job)["url"]
    old = redis.Redis.from_url(first)
    assert old.ping()
    second = door(api, job)["url"]
    assert urlsplit(second).password != urlsplit(first).password
    assert "WRONGPASS" in refused(lambda: redis.Redis.from_url(first).ping()) or \
        "invalid username-password" in refused(lambda: redis.Redis.from_url(first).ping())
    refused(old.ping)  # the old learner's connection was closed, and it cannot come back
    assert redis.Redis.from_url(second).ping()
    assert Job.objects.get(pk=job.pk).learner_redis_password_sha256  # kept (hashed) to restore the user


def test_the_door_closes_when_the_job_ends(streams, django_capture_on_commit_callbacks) -> None:
    owner = factories.user()
    api = owner_api(owner)
    job = running_job(owner, api)
    url = door(api, job)["url"]
    learner = redis.Redis.from_url(url)
    assert learner.ping()
    with django_capture_on_commit_callbacks(execute=True):
        assert api.post(f"/api/jobs/{job.pk}/cancel/").status_code == 200
    refused(learner.ping)  # its connection closed with the user
    refused(lambda: redis.Redis.from_url(url).ping())
    assert stream.client().acl_getuser(learner_username(job.pk)) is None
    late = api.post(f"/api/jobs/{job.pk}/learner/streams/")
    assert late.status_code == 400 and "cancelled" in late.json()["detail"]


def test_only_the_owner_opens_the_door(streams) -> None:
    owner, staff = factories.user(), factories.user(is_staff=True)
    job = running_job(owner, owner_api(owner))
    assert owner_api(staff).post(f"/api/jobs/{job.pk}/learner/streams/").status_code == 403
    assert owner_api(factories.user()).post(f"/api/jobs/{job.pk}/learner/streams/").status_code == 404
    assert APIClient().post(f"/api/jobs/{job.pk}/learner/streams/").status_code == 401
    assert stream.client().acl_getuser(learner_username(job.pk)) is None


def test_a_redis_restart_that_lost_the_user_lets_the_learner_in_again_at_its_heartbeat(streams, tmp_path) -> None:
    owner = factories.user()
    api = owner_api(owner)
    job = running_job(owner, api)
    url = door(api, job)["url"]
    streams.kill()
    streams.start()  # ACL users are not in the AOF: the user is gone
    stream.client.cache_clear()
    refused(lambda: redis.Redis.from_url(url).ping())
    assert api.post(f"/api/jobs/{job.pk}/learner/", {"t_train": None}, format="json").status_code == 200
    assert redis.Redis.from_url(url).ping()  # the same password again


def test_without_per_job_users_the_learner_gets_the_sites_url_and_is_told(streams, settings) -> None:
    settings.LEARNER_REDIS_USERS = False
    owner = factories.user()
    api = owner_api(owner)
    job = running_job(owner, api)
    given = door(api, job)
    assert given["isolated"] is False and "ECHO2_LEARNER_REDIS_USERS is off" in given["reason"]
    assert given["url"] == streams.url and Job.objects.get(pk=job.pk).learner_redis_password_sha256 == ""
    assert stream.client().acl_getuser(learner_username(job.pk)) is None


@pytest.mark.timeout(120)
def test_a_learner_shut_out_stops_retrying_soon(streams, monkeypatch, django_capture_on_commit_callbacks) -> None:
    """A refused password is not an outage to ride out for the learner's whole --redis-retry (300 s): its job ended
    (or another learner took the door), so it gives up after AUTH_RETRY_S."""
    owner = factories.user()
    api = owner_api(owner)
    job = running_job(owner, api)
    buffer = replay.ReplayBuffer(replay.connect(door(api, job)["url"]), job.pk, retry_for_s=300)
    assert buffer.counters() == {}
    with django_capture_on_commit_callbacks(execute=True):
        api.post(f"/api/jobs/{job.pk}/cancel/")
    monkeypatch.setattr(replay, "AUTH_RETRY_S", 1.0)
    with pytest.raises(redis.AuthenticationError):
        buffer.counters()


def test_readiness_checks_the_sites_redis_too_when_the_streams_are_apart(streams, settings, tmp_path) -> None:
    from django.test import Client

    from marketplace.infra import probes

    settings.REDIS_URL = PrivateRedis(tmp_path / "none").url  # the channel layer's Redis: nothing listens there
    probes.site_redis.cache_clear()
    try:
        checks = Client().get("/readyz").json()["checks"]
    finally:
        probes.site_redis.cache_clear()
    assert checks["redis"] == "ok" and checks["site_redis"].startswith("down")
