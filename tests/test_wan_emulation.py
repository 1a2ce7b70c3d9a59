"""Who emulates a WAN link's round trip, jitter and loss (bench/wan/netns.py): tc netem where the kernel has
``sch_netem``, else our delay proxy; tbf shapes the rates either way. The tc command lines are built without root;
the detection and the bench's refusal of ``--link-emulation netem`` need namespaces (this machine's kernel has no
netem, so they see it refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.wan import netns, profile
from bench.wan.stack import WanStack

NO_NAMESPACES = netns.unavailable()
needs_namespaces = pytest.mark.skipif(NO_NAMESPACES is not None, reason=f"no network namespaces: {NO_NAMESPACES}")


def test_netem_is_the_root_and_tbf_its_child_with_the_links_delay_jitter_and_loss() -> None:
    link = profile.load("harsh").agents[0]  # 50 Mbit/s, 150 ms round trip, 10 ms jitter, 1 % loss
    root, child = netns.link_qdiscs("e2w1-a0", "eth0", link.up_mbit, link, "netem")
    tc = ["ip", "netns", "exec", "e2w1-a0", "tc", "qdisc", "replace", "dev", "eth0"]
    assert root == tc + ["root", "handle", "1:", "netem", "limit", "1000", "delay", "75ms", "10ms", "loss", "1%"]
    assert child == tc + ["parent", "1:1", "handle", "10:", "tbf", "rate", "50mbit", "burst", "62500", "latency",
                          "50ms"]


def test_netem_limit_holds_two_bandwidth_delay_products_and_a_clean_link_adds_no_jitter_or_loss() -> None:
    fast = profile.Link(up_mbit=1000, down_mbit=1000, rtt_ms=300)
    root, _ = netns.link_qdiscs("ns", "veth0", fast.down_mbit, fast, "netem")
    # 1 Gbit/s for 150 ms one way: 12,384 packets of 1514 bytes in flight, the delay line holds twice that
    assert root[root.index("limit") + 1] == "24769" and root[-2:] == ["delay", "150ms"]


def test_with_the_proxy_tc_has_tbf_alone() -> None:
    link = profile.load("paper").agents[0]
    (only,) = netns.link_qdiscs("ns", "eth0", link.down_mbit, link, "proxy")
    assert only == ["ip", "netns", "exec", "ns", "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
                    "50mbit", "burst", "62500", "latency", "50ms"]
    with pytest.raises(ValueError, match="unknown link emulation"):
        netns.link_qdiscs("ns", "eth0", 50, link, "ns3")


@pytest.mark.parametrize("emulation", ["netem", "proxy"])
def test_the_proxy_adds_delay_only_where_netem_does_not(tmp_path: Path, emulation: str) -> None:
    net = netns.Net(profile.load("paper").with_agents(2), emulation=emulation)
    stack = WanStack(net, tmp_path)
    stack.stack.start = lambda *argv: None  # the config is what is checked; no process, no namespace
    stack.start_proxy("a0", [8200], bulk=(8200,))
    config = json.loads((tmp_path / "proxy-a0.json").read_text())
    assert config["tap"]["bulk"] == [8200]  # the tap stays: every table reads it
    if emulation == "netem":
        assert config["link"] == {} and config["peers"] == {}
    else:
        assert config["link"]["rtt_ms"] == 40 and len(config["peers"]) == 4


def test_an_unknown_emulation_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown link emulation 'tc'"):
        netns.choose_emulation("tc")
    assert netns.choose_emulation("proxy") == ("proxy", "asked for")


@needs_namespaces
def test_detection_says_why_netem_cannot_be_used_and_auto_falls_back() -> None:
    reason = netns.netem_unavailable()
    emulation, why = netns.choose_emulation("auto")
    if reason is None:  # a kernel with sch_netem
        assert emulation == "netem"
        return
    assert "netem" in reason and emulation == "proxy" and why == reason
    with pytest.raises(ValueError, match="--link-emulation netem: .*netem"):
        netns.choose_emulation("netem")
    assert not [n for n in netns.namespaces() if n.endswith("netem-probe")]  # the probe's namespace is gone


@needs_namespaces
def test_the_bench_refuses_netem_where_the_kernel_has_none(capsys: pytest.CaptureFixture) -> None:
    import shutil

    if netns.netem_unavailable() is None or shutil.which("redis-server") is None:
        pytest.skip("this kernel has netem (or no redis-server): nothing to refuse")
    from bench import bench_wan

    assert bench_wan.main(["--profiles", "paper", "--link-emulation", "netem"]) == 2
    assert "no sch_netem" in capsys.readouterr().out


@pytest.mark.parametrize("emulation", ["netem", "proxy"])
def test_up_says_who_emulates_the_links_and_each_links_settings(emulation: str) -> None:
    from bench.wan.__main__ import describe

    net = netns.Net(profile.load("harsh").with_agents(2), emulation=emulation)
    lines = describe(net, "the reason")
    who = "tc netem" if emulation == "netem" else "our delay proxy"
    assert lines[0].startswith(f"links: rates by tc tbf; round trip, jitter and loss by {who}")
    assert "the reason" in lines[0]
    slow = lines.index(f"{net.ns('a1')} {net.address('a1')} up 10 down 10 Mbit/s rtt 150 ms jitter 10 ms loss 1%")
    up, down = lines[slow + 1], lines[slow + 2]
    assert up.startswith("  up (eth0): ") and down.startswith("  down (its core veth): ")
    assert "tbf rate 10mbit" in up and "tbf rate 10mbit" in down
    assert ("netem limit 1000 delay 75ms 10ms loss 1%" in up) == (emulation == "netem")
