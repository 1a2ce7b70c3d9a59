"""The streams' Redis as docker/compose.yaml runs it (TLS only, a password for the site) with certificates from
docker/make-tls.sh, on a private redis-server: the site makes a learner's door over ``rediss://``, the learner gets
in with the CA and its own user, and neither a plain connection nor one that does not check the certificate does
(docs/trust.md "Deploying it: TLS and ACLs")."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml

from dataplane import replay
from dataplane.learner_acl import learner_username
from echo2_site.demo import free_port

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "site-streams-password"


@pytest.fixture
def tls_streams(tmp_path):
    """redis-server started with the compose file's `streams` command, its paths and port made local."""
    if shutil.which("openssl") is None or shutil.which("redis-server") is None:
        pytest.skip("openssl and redis-server are needed")
    tls = tmp_path / "tls"
    subprocess.run([str(ROOT / "docker" / "make-tls.sh")], env={"TLS_DIR": str(tls), "STREAMS_PUBLIC_HOST": "127.0.0.1",
                                                                "PATH": "/usr/bin:/bin"}, check=True, timeout=120)
    port = free_port()
    command = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]["streams"]["command"]
    argv = [word.replace("/tls/", f"{tls}/") for word in command]
    argv[argv.index("--tls-port") + 1] = str(port)
    argv[argv.index("--requirepass") + 1] = PASSWORD
    server = subprocess.Popen([shutil.which("redis-server"), *argv[1:], "--bind", "127.0.0.1", "--dir", str(tmp_path),
                               "--save", ""], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    site_url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={tls}/ca.crt&ssl_cert_reqs=required"
    client = redis.Redis.from_url(site_url, socket_connect_timeout=1)
    deadline = time.monotonic() + 15
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if server.poll() is not None:
                pytest.skip("this redis-server has no TLS")
            assert time.monotonic() < deadline, "the TLS redis-server did not answer"
            time.sleep(0.1)
    client.close()
    yield {"site_url": site_url, "public_url": f"rediss://127.0.0.1:{port}/0", "ca": str(tls / "ca.crt"),
           "port": port}
    server.terminate()
    server.wait(10)


def test_a_learner_gets_in_over_tls_with_its_own_user_and_nothing_less(tls_streams, settings) -> None:
    from marketplace.infra import learner_door, stream

    settings.STREAMS_REDIS_URL, settings.STREAMS_PUBLIC_URL = tls_streams["site_url"], tls_streams["public_url"]
    settings.LEARNER_REDIS_USERS = True
    stream.client.cache_clear()
    try:
        door, _ = learner_door.door_open(7)
    finally:
        stream.client.cache_clear()
    assert door.isolated and door.url.startswith(f"rediss://{learner_username(7)}:")
    assert "ssl_ca_certs" not in door.url and PASSWORD not in door.url  # the site's CA path and password stay home

    learner = replay.connect(door.url, ca_file=tls_streams["ca"])
    buffer = replay.ReplayBuffer(learner, 7)
    buffer.ensure_groups()
    assert buffer.add_prompts(["1+1="]) == 1 and buffer.outstanding() == 1
    with pytest.raises(redis.ResponseError, match="no permissions"):
        learner.keys("*")
    learner.close()

    plain = door.url.replace("rediss://", "redis://")
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(plain, socket_timeout=2, socket_connect_timeout=2).ping()
    with pytest.raises(redis.ConnectionError) as unchecked:  # the system's CAs do not know this one
        replay.connect(door.url, socket_timeout=5).ping()
    assert isinstance(unchecked.value.__context__, ssl.SSLError) or "certificate" in str(unchecked.value).lower()
