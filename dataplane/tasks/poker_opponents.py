"""The poker environment's fixed opponents (``opponent = "heuristic"`` or ``"random"``; docs/tasks.md "poker"): each
reads the hand's state in PokerKit and answers one option as the agent would write it. Both are deterministic given
the hand (its seed and its actions so far), so a worker and the learner's audit replay the same hand."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from .base import TaskSpecError

Hand = Any  # a ``poker.Hand``: imported from there, this module would close an import cycle


def pokerkit() -> Any:
    try:
        import pokerkit as pk
    except ImportError:
        raise TaskSpecError("env: poker needs PokerKit: pip install 'echo2[poker]'") from None
    return pk


def heuristic(hand: Hand) -> str:
    """A fixed opponent: by hand strength (PokerKit's evaluation after the flop), raise strong hands, call medium
    ones, check or fold weak ones."""
    pk, s = pokerkit(), hand.state
    hole, board = hand.holes[s.actor_index], hand.board()
    if board:
        label = pk.StandardHighHand.from_game(hole, board).entry.label
        strength = min(2, list(pk.Label).index(label))  # high card 0, one pair 1, better 2
    else:
        ranks = sorted("23456789TJQKA".index(c.rank.value) for c in hole)
        strength = 2 if ranks[0] == ranks[1] and ranks[0] >= 6 else 1 if ranks[1] >= 9 or ranks[0] == ranks[1] else 0
    call, span = s.checking_or_calling_amount, hand.raise_range()
    if strength == 2 and span is not None:
        return f"{'raise' if max(s.bets) else 'bet'} {min(span[1], max(span[0], s.total_pot_amount))}"
    if strength >= 1 or call <= hand.game.blinds[0]:
        return f"call {call}" if call else "check"
    return "fold"


def random_player(hand: Hand) -> str:
    """A random legal option (and amount), drawn from the hand's seed and its count of actions, so it replays."""
    rng = random.Random(f"{hand.seed}/{len(hand.events)}")
    option = rng.choice(hand.options())
    span = hand.raise_range()
    if " N (" in option and span is not None:
        return f"{option.split()[0]} {rng.randint(*span)}"
    return option.split()[0] if option.startswith("call") else option


POLICIES: dict[str, Callable[[Hand], str]] = {"heuristic": heuristic, "random": random_player}
