"""``python -m bench.wan up --profile paper [--agents N] [--link-emulation auto|netem|proxy]`` builds a topology,
prints who emulates the links' delay (tc netem where the kernel has it, else our proxy, which ``up`` does not start:
without netem the namespaces carry the rates alone) and each node's link, and holds it until Ctrl-C/SIGTERM;
``python -m bench.wan down --all-mine`` removes what a killed run left (namespaces named e2w<pid>- whose process is
gone, and the processes inside them)."""

from __future__ import annotations

import argparse
import sys
import time

from . import netns, profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="Build a topology and hold it until interrupted.")
    up.add_argument("--profile", default="paper", help="A shipped profile (paper, harsh) or a TOML file.")
    up.add_argument("--agents", type=int, help="Number of agents (default: the profile's).")
    up.add_argument("--link-emulation", choices=netns.EMULATIONS, default="auto", help="Who adds the links' round "
                    "trip, jitter and loss: tc netem, the proxy (started by the bench per service, not by `up`), or "
                    "auto: netem if the kernel has it.")
    down = sub.add_parser("down", help="Remove namespaces of ours.")
    down.add_argument("--all-mine", action="store_true", required=True,
                      help="Every e2w<pid>- namespace whose creating process is gone.")
    down.add_argument("--including-live", action="store_true", help="Also those of runs still going.")
    args = parser.parse_args(argv)
    if args.command == "down":
        removed = netns.down_all_mine(including_live=args.including_live)
        print(f"removed {len(removed)} namespace(s)" + (f": {', '.join(removed)}" if removed else ""))
        return 0
    reason = netns.unavailable()
    if reason:
        print(f"cannot build a topology: {reason}", file=sys.stderr)
        return 2
    topology = profile.load(args.profile)
    if args.agents:
        topology = topology.with_agents(args.agents)
    try:
        emulation, why = netns.choose_emulation(args.link_emulation)
    except ValueError as err:
        print(f"cannot build a topology: {err}", file=sys.stderr)
        return 2
    netns.on_signals_exit()
    with netns.Net(topology, emulation=emulation) as net:
        print("\n".join(describe(net, why)), flush=True)
        print("ready", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 130
    return 0


def describe(net: netns.Net, why: str) -> list[str]:
    """What ``up`` built: who emulates the delay, jitter and loss (and why), then each node's namespace, address and
    link, and the tc qdiscs on each direction of it (after ``tc qdisc replace dev DEV``)."""
    if net.emulation == "netem":
        head = f"links: rates by tc tbf; round trip, jitter and loss by tc netem ({why})"
    else:
        head = (f"links: rates by tc tbf; round trip, jitter and loss by our delay proxy ({why}), which the bench "
                "starts in front of each service: these namespaces alone carry the rates only")
    lines = [head]
    for node, link in net.topology.nodes():
        lines.append(f"{net.ns(node)} {net.address(node)} up {link.up_mbit:g} down {link.down_mbit:g} Mbit/s "
                     f"rtt {link.rtt_ms:g} ms jitter {link.jitter_ms:g} ms loss {100 * link.loss:g}%")
        for direction, mbit, dev in (("up", link.up_mbit, "eth0"), ("down", link.down_mbit, "its core veth")):
            qdiscs = netns.link_qdiscs(net.ns(node), "-", mbit, link, net.emulation)
            lines.append(f"  {direction} ({dev}): " + " / ".join(" ".join(argv[9:]) for argv in qdiscs))
    return lines


if __name__ == "__main__":
    sys.exit(main())
