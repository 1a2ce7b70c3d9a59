"""Relay addresses and snapshot URLs other machines will dial: host:port with a real port, never link-local or a
cloud metadata service, loopback and private ranges only where a setting allows them."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from marketplace.core.addresses import AddressError, PeerPolicy, check_host_port, check_url

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


ANY = PeerPolicy(allow_loopback=True, allow_private=True)


@pytest.mark.parametrize(("host", "policy", "why"), [
    # every numeric form a resolver takes as IPv4 (inet_aton), issue 26: they all passed as "host names"
    ("2852039166", ANY, "169.254.169.254 is a cloud metadata service"),
    ("0xa9fea9fe", ANY, "169.254.169.254 is a cloud metadata service"),
    ("0251.0376.0251.0376", ANY, "169.254.169.254 is a cloud metadata service"),
    ("169.254.43518", ANY, "169.254.169.254 is a cloud metadata service"),
    ("0xA9.0xFE.0xA9.0xFE", ANY, "169.254.169.254 is a cloud metadata service"),
    ("[64:ff9b::a9fe:a9fe]", ANY, "169.254.169.254 is a cloud metadata service"),
    ("169.254.1", ANY, "169.254.0.1 is link-local"),
    ("127.1", STRICT, "127.0.0.1 is loopback"),
    ("2130706433", STRICT, "127.0.0.1 is loopback"),
    ("0177.0.0.1", STRICT, "127.0.0.1 is loopback"),
    ("0x7f.1", STRICT, "127.0.0.1 is loopback"),
    ("0", ANY, "0.0.0.0 is not a unicast address"),
    ("0x0", ANY, "0.0.0.0 is not a unicast address"),
    ("10.1", STRICT, "10.0.0.1 is a private address"),
    ("3232235777", STRICT, "192.168.1.1 is a private address"),
    # a host ending in a number that is no address: refused, not looked up as a name
    ("1.2.3.4.5", ANY, "ends in a number but is no IPv4 address"),
    ("256.1.1.1", ANY, "ends in a number but is no IPv4 address"),
    ("4294967296", ANY, "ends in a number but is no IPv4 address"),
    ("08.0.0.1", ANY, "ends in a number but is no IPv4 address"),
    ("relay.example.123", ANY, "ends in a number but is no IPv4 address"),
])
def test_numeric_address_forms_are_the_addresses_they_dial(host, policy, why):
    with pytest.raises(AddressError, match=why):
        check_host_port(f"{host}:7000", policy)
    with pytest.raises(AddressError, match=why):
        check_url(f"http://{host}:7000/v1/", policy)


@pytest.mark.parametrize(("value", "policy", "tidy"), [
    ("127.1:7000", LOOPBACK, "127.0.0.1:7000"),  # checked and written as the address it dials
    ("134744072:53", STRICT, "8.8.8.8:53"),
    ("0x08.0x08.0x08.0x08:53", STRICT, "8.8.8.8:53"),
    ("1e100.net:443", STRICT, "1e100.net:443"),  # a name whose last label is not a number stays a name
    ("7.example:443", STRICT, "7.example:443"),
])
def test_numeric_forms_that_peers_may_dial_are_tidied(value, policy, tidy):
    assert check_host_port(value, policy) == tidy
