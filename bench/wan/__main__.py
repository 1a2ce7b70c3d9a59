"""``python -m bench.wan up --profile paper [--agents N]`` builds a topology and holds it until Ctrl-C/SIGTERM;
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
    netns.on_signals_exit()
    with netns.Net(topology) as net:
        for node, link in topology.nodes():
            print(f"{net.ns(node)} {net.address(node)} up {link.up_mbit:g} down {link.down_mbit:g} Mbit/s "
                  f"rtt {link.rtt_ms:g} ms", flush=True)
        print("ready", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
