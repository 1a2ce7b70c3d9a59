"""The fleet bench's accounting (bench/fleet): what the agents' frames say, heartbeats paired with the site's
records, groups lost, and the stand-in engine's records."""

from __future__ import annotations

import json

from bench.fleet import report
from bench.fleet.engine import StandInEngine
from bench.fleet.probe import Probe, frame_head
from worker_agent.engines.base import SamplingParams


def test_a_frame_is_named_by_its_head_and_tail_however_long():
    group = {"type": "submit", "job_id": 1, "groups": [{"lease_id": "l1", "records": ["x" * 5000]}], "lease": 2,
             "id": "r7"}
    assert frame_head(json.dumps(group)) == ("submit", "r7")
    assert frame_head(json.dumps({"type": "heartbeat", "state": "idle"})) == ("heartbeat", None)


def test_replies_verdicts_and_refusals_are_paired_with_their_requests():
    probe = Probe({"k": 5})
    probe.on_send(5, json.dumps({"type": "lease_request", "job_id": 1, "groups": 2, "id": "r1"}))
    probe.on_receive(5, json.dumps({"type": "lease", "job_id": 1, "timeout": 30, "ref_id": "r1", "leases": [
        {"lease_id": "a", "group_id": "g", "prompt": "1+1="}, {"lease_id": "b", "group_id": "g", "prompt": "1+2="}]}))
    probe.on_send(5, json.dumps({"type": "submit", "job_id": 1, "groups": [], "lease": 1, "id": "r2"}))
    probe.on_receive(5, json.dumps({"type": "submitted", "job_id": 1, "ref_id": "r2", "results": [
        {"type": "accepted", "job_id": 1, "lease_id": "a", "accepted": 8, "rejected": 0}], "lease": None}))
    probe.on_send(5, json.dumps({"type": "trajectories", "group": {"lease_id": "b"}, "id": "r3"}))
    probe.on_receive(5, json.dumps({"type": "rejected", "ref": "trajectories", "ref_id": "r3",
                                    "reason": "rate limit: at most 50 messages per second"}))
    fleet = report.merge([probe.summary()])
    assert [(kind, reply) for kind, _, _, reply in fleet["replies"]] == [
        ("lease_request", "lease"), ("submit", "submitted"), ("trajectories", "rejected")]
    assert fleet["accepted"] == {"a"} and len(fleet["rejections"]) == 1
    assert report.lost_groups(fleet, before=float("inf")) == 1  # "b": refused by the transport, never delivered


def test_heartbeats_are_paired_in_order_with_the_sites_handling():
    sent = {"1": [10.0, 12.0, 14.0, 16.0]}
    handled = {1: [10.1, 13.5, 14.2]}  # the third came late, the fourth never
    lags = report.heartbeat_lags(sent, handled, 0.0, 20.0)
    assert lags["sent"] == 4 and lags["unhandled"] == 1 and lags["on_time"] == 2
    assert report.heartbeat_lags(sent, handled, 11.0, 13.0)["sent"] == 1  # only those sent in the window


def test_the_stand_in_engine_speaks_the_tiny_models_tokens(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"<pad>": 0, "<s>": 1, "</s>": 2,
                                                                             "0": 3, "1": 4, "+": 5, "=": 6}}}))
    engine = StandInEngine(str(tmp_path), tokens_per_s=1e6)
    (group,) = engine.generate(["1+1="], n=3, params=SamplingParams(max_new_tokens=2))
    assert len(group) == 3
    assert group[0].prompt_ids == [1, 4, 5, 4, 6] and group[0].completion_ids == [3, 3]
    assert group[0].text == "00" and len(group[0].logprobs) == 2


def test_the_lost_cutoff_is_the_longest_reply_timeout_an_agent_can_use():
    """A lease is judged lost only once every agent's reply timeout has passed since it came: the agent derives its
    own from the round trips it measured (worker_agent/timing.py), at most its ceiling, whatever the link."""
    from bench.fleet.rows import REPLY_TIMEOUT_S
    from worker_agent.timing import REPLY_CEILING_S, RoundTrips

    slow = RoundTrips()
    for seconds in (5.0, 40.0, 0.1, 90.0):  # a link as bad as they come
        slow.add(seconds)
    assert REPLY_TIMEOUT_S == REPLY_CEILING_S >= slow.reply_timeout() and REPLY_TIMEOUT_S > 30.0
    fleet = {"leased": {"a": 10.0, "b": 50.0, "c": 95.0}, "accepted": {"a"}, "handed_back": set(),
             "refused_groups": set()}
    cut = 100.0 - REPLY_TIMEOUT_S  # a release at t = 100
    assert report.leased_before(fleet, before=cut) == 1 and report.lost_groups(fleet, before=cut) == 0
    assert report.lost_groups(fleet, before=100.0) == 2, "b and c may still be in an agent's retry: not judged"
