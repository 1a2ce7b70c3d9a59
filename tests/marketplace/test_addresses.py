"""Relay addresses and snapshot URLs other machines will dial: host:port with a real port, never link-local or a
cloud metadata service, loopback and private ranges only where a setting allows them."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from marketplace.addresses import AddressError, PeerPolicy, check_host_port, check_url

from . import factories

STRICT, LOOPBACK, LAN = PeerPolicy(), PeerPolicy(allow_loopback=True), PeerPolicy(allow_private=True)


@pytest.mark.parametrize(("value", "policy", "tidy"), [
    ("198.51.100.300.example.com:7000", STRICT, "198.51.100.300.example.com:7000"),
    ("Relay.Example.NET.:07000", STRICT, "relay.example.net:7000"),
    ("8.8.8.8:1", STRICT, "8.8.8.8:1"),
    ("[2001:4860:4860::8888]:65535", STRICT, "[2001:4860:4860::8888]:65535"),
    ("127.0.0.1:7000", LOOPBACK, "127.0.0.1:7000"),
    ("localhost:7000", LOOPBACK, "localhost:7000"),
    ("[::1]:7000", LOOPBACK, "[::1]:7000"),
    ("10.0.0.1:7000", LAN, "10.0.0.1:7000"),
    ("[fd12::1]:7000", LAN, "[fd12::1]:7000"),
])
def test_addresses_peers_may_dial(value, policy, tidy):
    assert check_host_port(value, policy) == tidy


@pytest.mark.parametrize(("value", "policy", "why"), [
    ("169.254.169.254:80", PeerPolicy(True, True), "cloud metadata service"),
    ("[::ffff:169.254.169.254]:80", PeerPolicy(True, True), "cloud metadata service"),
    ("metadata.google.internal:80", PeerPolicy(True, True), "cloud metadata service"),
    ("[fd00:ec2::254]:80", PeerPolicy(True, True), "cloud metadata service"),
    ("169.254.1.2:7000", PeerPolicy(True, True), "link-local"),
    ("[fe80::1]:7000", PeerPolicy(True, True), "link-local"),
    ("0.0.0.0:7000", PeerPolicy(True, True), "not a unicast address"),
    ("224.0.0.1:7000", PeerPolicy(True, True), "not a unicast address"),
    ("127.0.0.1:7000", LAN, "loopback"),
    ("localhost:7000", STRICT, "loopback"),
    ("[::1]:7000", STRICT, "loopback"),
    ("10.1.2.3:7000", LOOPBACK, "private address"),
    ("192.168.1.5:7000", STRICT, "private address"),
    ("100.64.0.1:7000", STRICT, "private address"),
    ("relay:0", STRICT, "port must be 1-65535"),
    ("relay:65536", STRICT, "port must be 1-65535"),
    ("relay:http", STRICT, "port must be 1-65535"),
    ("relay", STRICT, "expected host:port"),
    (":7000", STRICT, "expected host:port"),
    ("::1:7000", LOOPBACK, "in brackets"),
    ("bad_host!:7000", STRICT, "neither an IP address nor a host name"),
])
def test_addresses_refused_with_the_reason(value, policy, why):
    with pytest.raises(AddressError, match=why):
        check_host_port(value, policy)


@pytest.mark.parametrize(("url", "why"), [
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata service"),
    ("ftp://203.0.113.1/v1/", "only http and https"),
    ("file:///etc/passwd", "only http and https"),
    ("http://user:pw@relay.example.net/v1/", "credentials"),
    ("http://127.0.0.1:9000/v1/", "loopback"),
    ("http://[fe80::1]:9000/v1/", "link-local"),
    ("http://relay.example.net:99999/v1/", "malformed URL"),
])
def test_snapshot_urls_refused_with_the_reason(url, why):
    with pytest.raises(AddressError, match=why):
        check_url(url, STRICT)
    assert check_url("https://learner.example.net:9000/v1/", STRICT) == "https://learner.example.net:9000/v1/"


@pytest.mark.django_db
@pytest.mark.parametrize("allow", [True, False])
def test_the_api_refuses_with_a_400_naming_the_field(redis_url, settings, allow):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "ALLOW_LOOPBACK_PEERS": allow, "ALLOW_PRIVATE_PEERS": False}
    owner = factories.user()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    worker = {"name": "rig", "price_per_hour": "0.3", "bandwidth_bps": 1000}
    metadata = api.post("/api/workers/", {**worker, "relay_address": "169.254.169.254:80"})
    assert metadata.status_code == 400
    assert metadata.json()["detail"] == "relay_address: 169.254.169.254 is a cloud metadata service"
    loopback = api.post("/api/workers/", {**worker, "relay_address": "127.0.0.1:7000"})
    assert loopback.status_code == (201 if allow else 400)
    assert api.post("/api/workers/", {**worker, "name": "b", "relay_address": "10.0.0.2:7000"}).status_code == 400
    job = factories.job(owner)
    api.post(f"/api/jobs/{job.pk}/start/")
    learner = api.post(f"/api/jobs/{job.pk}/learner/", {"relay_address": "[fe80::1]:7000"})
    assert learner.status_code == 400 and learner.json()["detail"] == "relay_address: fe80::1 is link-local"
    snap = api.post(f"/api/jobs/{job.pk}/snapshots/", {"version": 1, "url": "http://169.254.169.254/v1/",
                                                        "manifest": factories.manifest(job, 1)})
    assert snap.status_code == 400 and snap.json()["detail"] == "url: 169.254.169.254 is a cloud metadata service"
    good = api.post(f"/api/jobs/{job.pk}/snapshots/", {"version": 1, "url": "http://learner.example.net:9000/v1/",
                                                        "manifest": factories.manifest(job, 1)})
    assert good.status_code == 201, good.content
