"""Synthetic CPU load for the wire-only bench (bench/wan/wire.py ``load``): is a relay slowed by the cores it shares
or by the interpreter it shares with generation?

- ``python -m bench.wan.burn spin``: one process spinning in pure Python (a core's worth of demand, no GIL shared
  with anyone): the ``procs`` load, one beside each relay.
- ``python -m bench.wan.burn relay <dataplane.broadcast.process arguments>``: the relay process with one more
  thread spinning in pure Python, as an agent's generation thread does between its tensor operations (it holds the
  GIL but at each switch interval): the ``threads`` load.
"""

from __future__ import annotations

import sys
import threading


def spin() -> None:
    x = 0
    while True:
        for i in range(1000):
            x = (x + i) % 7919


def main(argv: list[str]) -> int:
    if argv[:1] == ["spin"]:
        spin()
    if argv[:1] == ["relay"]:
        from dataplane.broadcast import process

        threading.Thread(target=spin, name="generation-like", daemon=True).start()
        return process.main(argv[1:])
    print("usage: python -m bench.wan.burn spin | relay <dataplane.broadcast.process arguments>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
