"""A relay that flips a byte of chosen chunks as it sends them: the fault a relay test injects, kept out of
the production relay.

``python -m tests.dataplane.broadcast.corrupting_relay --corrupt-chunk 3 [--corrupt-times N] ARGS`` runs
``python -m dataplane.broadcast.process ARGS`` with a :class:`CorruptingRelay`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from functools import partial
from typing import Any

from dataplane.broadcast import process
from dataplane.broadcast.relay import SnapshotRelay


class CorruptingRelay(SnapshotRelay):
    """Sends chunk ``i`` with its first byte flipped (under the manifest's sha256) the first ``corrupt[i]`` times."""

    def __init__(self, *args: Any, corrupt: dict[int, int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.corrupt = dict(corrupt)

    async def _send_chunk(self, writer: asyncio.StreamWriter, index: int, offset: int, data: bytes, *,
                          peer: str) -> None:
        if offset == 0 and self.corrupt.get(index, 0) > 0:  # the chunk's first part: each send of it starts there
            self.corrupt[index] -= 1
            data = bytes([data[0] ^ 0xFF]) + data[1:] if data else b"\0"
        await super()._send_chunk(writer, index, offset, data, peer=peer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.dataplane.broadcast.corrupting_relay",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--corrupt-chunk", type=int, action="append", default=[], help="chunk index to corrupt")
    parser.add_argument("--corrupt-times", type=int, default=1, help="how many sends of each to corrupt")
    ours, rest = parser.parse_known_args(argv)
    corrupt = {index: ours.corrupt_times for index in ours.corrupt_chunk}
    return process.main(rest, make_relay=partial(CorruptingRelay, corrupt=corrupt))


if __name__ == "__main__":
    sys.exit(main())
