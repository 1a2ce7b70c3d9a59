"""Control messages: every message type survives a JSON round trip; a bad frame is refused with a reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dataplane.messages import (
    Accepted,
    Assign,
    Heartbeat,
    Hello,
    Lease,
    LeasedPrompt,
    LeaseRequest,
    MessageError,
    NoWork,
    Rejected,
    Release,
    SnapshotAvailable,
    SnapshotInstalled,
    Trajectories,
    Welcome,
    parse_agent_message,
    parse_site_message,
)
from dataplane.records import Trajectory, TrajectoryGroup

AGENT_MESSAGES = [
    Hello(agent_version="0.1.0", installed_version=4),
    Hello(agent_version="0.1.0"),
    Heartbeat(throughput=12.5, installed_version=3, job_id=7),
    Heartbeat(),
    Heartbeat(job_id=7, state="failed", reason="RuntimeError: CUDA error"),
    LeaseRequest(job_id=7, groups=4),
    Trajectories(group=TrajectoryGroup.of([Trajectory(
        job_id=7, lease_id="1-0", group_id="g1", prompt="3+4=", prompt_ids=[1, 5], completion="7",
        completion_ids=[3, 2], logprobs=[-0.5, -0.1], reward=1.0, version=2)])),
    SnapshotInstalled(job_id=7, version=6, seconds=0.75),
]

SITE_MESSAGES = [
    Welcome(worker_id=3, heartbeat_interval=2.5),
    Assign(job_id=7, model="/models/tiny", task={"name": "arithmetic", "modulus": 10}, group_size=8,
           max_new_tokens=4, temperature=1.0, top_p=0.9, snapshot={"version": 2}),
    Release(job_id=7, reason="job completed"),
    Lease(job_id=7, leases=[LeasedPrompt(lease_id="1-0", group_id="g1", prompt="3+4="),
                            LeasedPrompt(lease_id="1-1", group_id="g2", prompt="5+5=")], timeout=30.0),
    NoWork(job_id=7, retry_after=1.5),
    SnapshotAvailable(job_id=7, version=2, url="http://10.0.0.1:8000/v2/", manifest_sha256="c" * 64, manifest_bytes=913,
                      published_at=1700000000.5, parent="10.0.0.2:7001", parent_worker_id=4, children=[9],
                      credential="e2t1.7.3.2.2.1700000600." + "a" * 64, child_credential_sha256={9: "b" * 64}),
    Accepted(job_id=7, lease_id="1-0", accepted=7, rejected=1, reasons=["logprobs must be finite and <= 0"]),
    Rejected(reason="unknown message type 'hi'", ref="hi"),
]


def over_the_wire(message) -> Any:
    return json.loads(json.dumps(message.model_dump(mode="json")))


@pytest.mark.parametrize("message", AGENT_MESSAGES, ids=lambda m: m.type)
def test_agent_message_round_trips(message) -> None:
    parsed = parse_agent_message(over_the_wire(message))

    assert type(parsed) is type(message)
    assert parsed == message


@pytest.mark.parametrize("message", SITE_MESSAGES, ids=lambda m: m.type)
def test_site_message_round_trips(message) -> None:
    parsed = parse_site_message(over_the_wire(message))

    assert type(parsed) is type(message)
    assert parsed == message


def test_defaults_fill_in_on_parse() -> None:
    assert parse_agent_message({"type": "lease_request", "job_id": 7}).groups == 1
    assert parse_site_message({"type": "welcome", "worker_id": 1}).heartbeat_interval == 5.0


@pytest.mark.parametrize("raw", [["hello"], "hello", 42, None])
@pytest.mark.parametrize("parse", [parse_agent_message, parse_site_message])
def test_non_object_is_refused(parse, raw) -> None:
    with pytest.raises(MessageError, match=r"^a message must be a JSON object$"):
        parse(raw)


@pytest.mark.parametrize("parse", [parse_agent_message, parse_site_message])
def test_missing_type_is_refused(parse) -> None:
    with pytest.raises(MessageError, match=r"^a message needs a 'type' field$"):
        parse({"job_id": 7})


def test_unknown_type_is_refused_naming_it() -> None:
    with pytest.raises(MessageError, match=r"^unknown message type 'hi'$"):
        parse_agent_message({"type": "hi"})


def test_each_side_refuses_the_other_sides_messages() -> None:
    with pytest.raises(MessageError, match=r"^unknown message type 'welcome'$"):
        parse_agent_message(over_the_wire(Welcome(worker_id=1)))
    with pytest.raises(MessageError, match=r"^unknown message type 'hello'$"):
        parse_site_message(over_the_wire(Hello(agent_version="1")))


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({"type": "lease_request", "job_id": "seven"}, "lease_request.job_id"),
        ({"type": "lease_request", "job_id": 0}, "lease_request.job_id"),
        ({"type": "lease_request", "job_id": 7, "groups": 65}, "lease_request.groups"),
        ({"type": "heartbeat", "throughput": -1.0}, "heartbeat.throughput"),
        ({"type": "heartbeat", "throughput": "fast"}, "heartbeat.throughput"),
        ({"type": "heartbeat", "throughput": float("inf")}, "heartbeat.throughput"),
        ({"type": "heartbeat", "throughput": float("nan")}, "heartbeat.throughput"),
        ({"type": "heartbeat", "throughput": 1e300}, "heartbeat.throughput"),
        ({"type": "heartbeat", "installed_version": 2**40}, "heartbeat.installed_version"),
        ({"type": "heartbeat", "state": "mining"}, "heartbeat.state"),  # the states are a closed set
        ({"type": "heartbeat", "state": None}, "heartbeat.state"),
        ({"type": "heartbeat", "state": "failed", "reason": "x" * 201}, "heartbeat.reason"),
        ({"type": "hello", "agent_version": "1", "installed_version": 2**40}, "hello.installed_version"),
        # Issue 26 (Low): each reached PostgreSQL and came back a 500 or a dropped socket
        ({"type": "heartbeat", "state": "failed", "reason": "oom\x00"}, "heartbeat.reason"),
        ({"type": "hello", "agent_version": "1\x00"}, "hello.agent_version"),
        ({"type": "snapshot_installed", "job_id": 7, "version": 2**40, "seconds": 1.0}, "snapshot_installed.version"),
        ({"type": "snapshot_installed", "job_id": 2**40, "version": 1, "seconds": 1.0}, "snapshot_installed.job_id"),
        ({"type": "snapshot_installed", "job_id": 7, "version": 1, "seconds": 1e300}, "snapshot_installed.seconds"),
        ({"type": "snapshot_installed", "job_id": 7, "version": 1, "seconds": 1.0, "from_parent": 2**63},
         "snapshot_installed.from_parent"),
        ({"type": "relay_failed", "job_id": 7, "version": 2**40}, "relay_failed.version"),
        ({"type": "relay_failed", "job_id": 7, "version": 1, "culprit_worker_id": 2**40},
         "relay_failed.culprit_worker_id"),
        ({"type": "relay_failed", "job_id": 7, "version": 1, "reason": "\x00"}, "relay_failed.reason"),
        ({"type": "lease_return", "job_id": 7, "lease_id": "1\x00"}, "lease_return.lease_id"),
        ({"type": "heartbeat", "job_id": 2**40}, "heartbeat.job_id"),
        ({"type": "trajectories", "group": {"job_id": 7, "lease_id": "1-0", "group_id": "g", "version": 0,
                                            "records": []}}, "trajectories.group.records"),
        ({"type": "trajectories", "group": {"job_id": 7, "lease_id": "1-0", "group_id": "g", "version": 0,
                                            "records": "all"}}, "trajectories.group.records"),
        ({"type": "trajectories", "job_id": 7, "lease_id": "1-0", "records": []}, "trajectories.group"),
        ({"type": "hello"}, "hello.agent_version"),
        ({"type": "hello", "agent_version": "1", "colour": "blue"}, "hello.colour"),
    ],
)
def test_agent_message_with_bad_field_is_refused_naming_it(raw: dict[str, Any], where: str) -> None:
    with pytest.raises(MessageError) as err:
        parse_agent_message(raw)

    assert str(err.value).startswith(f"{where}: ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({"type": "welcome", "worker_id": "me"}, "welcome.worker_id"),
        ({"type": "lease", "job_id": 7, "leases": [{"lease_id": "1-0"}], "timeout": 5}, "lease.leases.0.group_id"),
        ({"type": "assign", "job_id": 7}, "assign.model"),
        ({"type": "accepted", "job_id": 7, "lease_id": "x", "accepted": 1, "rejected": 0, "reasons": "no"},
         "accepted.reasons"),
        ({"type": "snapshot", "job_id": 7, "version": 2, "url": "u", "manifest_sha256": "c" * 64,
          "manifest_bytes": 913, "published_at": 1.0, "child_credential_sha256": {"9": "not a digest"}},
         "snapshot.child_credential_sha256.9"),
        ({"type": "snapshot", "job_id": 7, "version": 2, "url": "u", "manifest_sha256": "C" * 64,
          "manifest_bytes": 913, "published_at": 1.0}, "snapshot.manifest_sha256"),
        ({"type": "snapshot", "job_id": 7, "version": 2, "url": "u", "manifest": {}, "manifest_sha256": "c" * 64,
          "manifest_bytes": 913, "published_at": 1.0}, "snapshot.manifest"),
    ],
)
def test_site_message_with_bad_field_is_refused_naming_it(raw: dict[str, Any], where: str) -> None:
    with pytest.raises(MessageError) as err:
        parse_site_message(raw)

    assert str(err.value).startswith(f"{where}: ")
