"""Heads-up hold'em for the ``sandbox`` task, on PokerKit: the paper's own case study (appendix F).

``{"name": "sandbox", "env": "poker", "limit": "no-limit", "blinds": [1, 2], "stack": 200, "opponent": "heuristic"}``.
PokerKit (``pip install 'echo2[poker]'``) holds every rule of the game: who acts, what is legal, the pots, the
showdown; nothing of poker's rules is written here. This module deals, renders and reads:

- **The deal** (F.3): the prompt names the hand's seed and the agent's seat; the deck is Python's
  ``random.Random(seed)`` shuffle of PokerKit's standard deck, and every card is dealt from it in order (burns
  included), so any worker and the learner's audit replay the same hand.
- **The messages** (F.4): each decision point is a user message (the hand's actions so far, board, hole cards,
  pot, this round's bets, stacks, the legal options with their amounts); the assistant answers one option as
  ``<answer>call</answer>`` (``fold``, ``check``, ``call``, ``bet N``, ``raise N``: N is the total it puts in this
  round). An answer that is not one of the options, or no answer, folds and is counted (``illegal``). After every
  action the environment replies: the next decision point, or the hand's end and its result. ``turn_format``
  ``"chatml"`` writes each reply as a ChatML user turn (``<|im_end|>`` ... ``<|im_start|>assistant``), the
  template of SmolLM2 and Qwen, so a chat job's model sees every decision point as a user message in its template.
- **The answer's opener** (``answer_prefix``, on by default with ``turn_format = "chatml"``): the environment writes
  ``<answer>`` at the start of every assistant turn (after the first message, and after each decision point), so the
  policy's tokens begin with the action word. The opener is the environment's text (loss mask 0); the answer is the
  turn's text up to ``</answer>`` or the end of its line, and it must be one of the options, else it folds and is
  counted as without the opener. A small instruct model rarely writes the opener itself (SmolLM2-135M: 1 legal
  answer in 18 decisions) but, given it, copies one of the listed answers about one time in five (docs/tasks.md).
- **The return and the group** (F.5): the return is the agent's chip result in big blinds, less
  ``illegal_penalty`` for an illegal answer (default 0; above it, an illegal answer scores below the legal fold it
  stands for: docs/tasks.md, poker); a group is the ``n`` plays of one prompt, i.e. the same cards from the same
  seat. The record's metadata carries the deal, the seat, the decisions and the illegal answers; its loss mask is
  1 on the assistant's tokens only.

Opponents: ``heuristic`` (hand strength: raise strong, call medium, check or fold weak), ``random`` (a random
legal option, drawn from the seed and the number of actions so far, so it replays) and ``self`` (the current
policy plays the other seat from its own view; its tokens are not learned, its return is in the metadata). In
self-play the opponent's choices are the worker's word: the replay checks they are legal and that every message
and the result follow from them, not that the policy chose them.
"""

from __future__ import annotations

import random
import re
import string
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .base import TaskSpecError
from .episodes import Episode, Turn
from .poker_opponents import POLICIES, pokerkit
from .sandbox import SYSTEM, Game, parse_action

LIMITS = ("no-limit", "fixed-limit")
OPPONENTS = ("heuristic", "random", "self")
TURN_FORMATS = ("plain", "chatml")
#: What the environment writes at the start of each assistant turn with ``answer_prefix``.
PREFIX = "<answer>"
#: PokerKit's heads-up seats: seat 0 posts the big blind, seat 1 is the button and posts the small blind.
SEAT_NAMES = ("big blind", "button")
STREETS = ("preflop", "flop", "turn", "river")
#: The most tokens of one environment message at one token per byte (a long no-limit hand's history included).
REPLY_TOKENS = 1024
_HEAD = re.compile(r"^Hand (\d+): heads-up (no-limit|fixed-limit) hold'em, blinds (\d+)/(\d+), stacks (\d+)\. "
                   r"You are the (big blind|button)\.\n")
_ANSWER = re.compile(r"\s*(fold|check|call|bet|raise)(?:\s+(\d+))?\s*", re.IGNORECASE)
_OPPONENT_ACT = re.compile(r"opponent (folds|checks|calls \d+|bets \d+|raises to \d+)")
_TURN_HEADS = {"plain": ("\n", "\n"),
               "chatml": ("<|im_end|>\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")}
_VERBS = {"folds": "fold", "checks": "check", "calls": "call", "bets": "bet", "raises": "raise"}
_SPECIAL = re.compile(r"<\|im_(?:start|end)\|>")


def _int(name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise TaskSpecError(f"{name}: must be an integer between {low} and {high}")
    return value


@dataclass
class Event:
    street: int
    seat: int
    text: str  # "folds", "checks", "calls 2", "bets 4", "raises to 6"

    def render(self, view: int) -> str:
        if self.seat != view:
            return f"opponent {self.text}"
        verb, _, rest = self.text.partition(" ")
        return " ".join(["you", _VERBS[verb], *([rest] if rest else [])])


@dataclass
class Hand:
    """One hand in PokerKit, dealt from its seed; ``agent`` is the seat whose record this is."""

    game: PokerGame
    seed: int
    agent: int
    state: Any = None
    deck: list[Any] = field(default_factory=list)
    holes: list[list[Any]] = field(default_factory=lambda: [[], []])
    events: list[Event] = field(default_factory=list)
    illegal: list[int] = field(default_factory=lambda: [0, 0])
    decisions: list[int] = field(default_factory=lambda: [0, 0])

    def __post_init__(self) -> None:
        pk, g = pokerkit(), self.game
        a = pk.Automation
        autos = (a.ANTE_POSTING, a.BET_COLLECTION, a.BLIND_OR_STRADDLE_POSTING, a.RUNOUT_COUNT_SELECTION,
                 a.HOLE_CARDS_SHOWING_OR_MUCKING,
                 a.HAND_KILLING, a.CHIPS_PUSHING, a.CHIPS_PULLING)
        sb, bb = g.blinds
        if g.limit == "no-limit":
            self.state = pk.NoLimitTexasHoldem.create_state(autos, True, 0, (sb, bb), bb, (g.stack, g.stack), 2,
                                                            mode=pk.Mode.CASH_GAME)
        else:
            self.state = pk.FixedLimitTexasHoldem.create_state(autos, True, 0, (sb, bb), bb, 2 * bb,
                                                               (g.stack, g.stack), 2, mode=pk.Mode.CASH_GAME)
        self.deck = list(pk.Deck.STANDARD)
        random.Random(self.seed).shuffle(self.deck)
        self.deck.reverse()  # dealt with pop(): the shuffle's first card first
        self.deal()

    def deal(self) -> None:
        """Burn and deal what the hand needs now, from the seeded deck."""
        s = self.state
        while True:
            if s.can_burn_card():
                s.burn_card(self.deck.pop())
            elif s.can_deal_hole():
                card = self.deck.pop()
                self.holes[s.hole_dealee_index].append(card)
                s.deal_hole(card)
            elif s.can_deal_board():
                s.deal_board([self.deck.pop() for _ in range(3 if not self.board() else 1)])
            else:
                return

    @property
    def over(self) -> bool:
        return not self.state.status

    @property
    def actor(self) -> int | None:
        return None if self.over else self.state.actor_index

    def board(self) -> list[Any]:
        return [c for cards in self.state.board_cards for c in cards]

    def raise_range(self) -> tuple[int, int] | None:
        s = self.state
        if not s.can_complete_bet_or_raise_to():
            return None
        return s.min_completion_betting_or_raising_to_amount, s.max_completion_betting_or_raising_to_amount

    def options(self) -> list[str]:
        """The legal answers of the seat to act, with their amounts, as the message lists them."""
        call = self.state.checking_or_calling_amount
        out = ["fold", f"call {call}"] if call else ["check"]
        span = self.raise_range()
        if span is not None:
            word = "raise" if max(self.state.bets) else "bet"
            lo, hi = span
            out.append(f"{word} {lo}" if lo == hi else f"{word} N ({lo} <= N <= {hi}, your total this round)")
        return out

    def tagged_options(self) -> list[str]:
        """The options as an answer is written, each one an answer to copy (a small model copies one; given
        ``raise N`` it copies the letter): ``<answer>call</answer> (1 more)``, ``<answer>raise 4</answer> (or raise
        N, N up to 40: your total this round)``, the smallest raise written out."""
        out, span = [], self.raise_range()
        for option in self.options():
            word = option.split()[0]
            if " N (" in option and span is not None:
                out.append(f"<answer>{word} {span[0]}</answer> (or {word} N, N up to {span[1]}: your total this round)")
            elif option.startswith("call"):
                out.append(f"<answer>call</answer> ({option.split()[1]} more)")
            else:
                out.append(f"<answer>{option}</answer>")
        return out

    def act(self, answer: str | None) -> bool:
        """The seat to act answers ``answer``; anything but a listed option folds. Whether it was legal."""
        s, seat = self.state, self.state.actor_index
        street, call = s.street_index, s.checking_or_calling_amount
        match = _ANSWER.fullmatch(answer or "")
        verb, amount = (match[1].lower(), match[2]) if match else ("", None)
        span, text = self.raise_range(), ""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PokerKit warns on a fold that could have checked
            if verb == "fold" and call and amount is None:
                s.fold()
                text = "folds"
            elif (verb == "check" and not call and amount is None) or (
                    verb == "call" and call and amount in (None, str(call))):
                s.check_or_call()
                text = f"calls {call}" if call else "checks"
            elif span is not None and verb == ("raise" if max(s.bets) else "bet"):
                to = int(amount) if amount is not None else span[0] if span[0] == span[1] else -1
                if span[0] <= to <= span[1]:
                    s.complete_bet_or_raise_to(to)
                    text = f"{verb}s {to}" if verb == "bet" else f"raises to {to}"
            legal = bool(text)
            if not legal:
                s.fold()
                text = "folds"
        self.decisions[seat] += 1
        self.illegal[seat] += not legal
        self.events.append(Event(street, seat, text))
        self.deal()
        return legal

    def fold(self) -> None:
        """The seat to act folds without answering (out of turns)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seat = self.state.actor_index
            self.state.fold()
        self.events.append(Event(self.state.street_index or 0, seat, "folds"))
        self.deal()

    def result(self, seat: int) -> float:
        """``seat``'s chip result in big blinds."""
        return (self.state.stacks[seat] - self.game.stack) / self.game.blinds[1]

    def history(self, view: int) -> str:
        parts = []
        for street, name in enumerate(STREETS):
            acts = [e.render(view) for e in self.events if e.street == street]
            if acts:
                parts.append(f"{name}: {', '.join(acts)}")
        return "; ".join(parts) or "none yet"

    def message(self, view: int) -> str:
        """The message ``view`` reads: its decision point, or the hand's end and its result."""
        s, other = self.state, 1 - view
        board = " ".join(map(repr, self.board())) or "none"
        cards = " ".join(map(repr, self.holes[view]))
        lines = [f"Actions: {self.history(view)}."]
        if self.over:
            won = s.stacks[view] - self.game.stack
            folded = any(e.text == "folds" for e in self.events)
            shown = "" if folded else f" The opponent's cards: {' '.join(map(repr, self.holes[other]))}."
            lines += [f"Hand over. Board: {board}. Your cards: {cards}.{shown}",
                      f"You {'won' if won >= 0 else 'lost'} {abs(won)} chips ({self.result(view):+g} big blinds)."]
            return "\n".join(lines)
        street = STREETS[s.street_index]
        lines += [f"Board: {board} ({street}). Your cards: {cards}.",
                  f"Pot {s.total_pot_amount}. This round you put in {s.bets[view]}, the opponent {s.bets[other]}. "
                  f"Stacks: you {s.stacks[view]}, the opponent {s.stacks[other]}.",
                  f"Your options: {' or '.join(self.tagged_options())}.",
                  "Reply with exactly one of them, nothing else."]
        return "\n".join(lines)


@dataclass
class _Table:
    """One episode in play: the hand, the agent's record, the self-play opponent's context, who awaits a message."""

    hand: Hand | None
    episode: Episode
    opponent_ids: list[int] = field(default_factory=list)
    agent_waits: bool = False
    opponent_waits: bool = True


class PokerGame(Game):
    """Heads-up hold'em on PokerKit (the module's docstring says how a hand is dealt, shown, answered, scored)."""

    name = "poker"
    alphabet = "".join(sorted(set(string.ascii_letters + string.digits + " .,:;'()/<>=|+-_\n")))

    def __init__(self, *, limit: str = "no-limit", blinds: list[int] | tuple[int, int] = (1, 2), stack: int = 200,
                 opponent: str = "heuristic", turn_format: str = "plain", answer_prefix: bool | None = None,
                 illegal_penalty: float = 0.0) -> None:
        if limit not in LIMITS:
            raise TaskSpecError(f"limit: must be one of {', '.join(LIMITS)}")
        if opponent not in OPPONENTS:
            raise TaskSpecError(f"opponent: must be one of {', '.join(OPPONENTS)}")
        if turn_format not in TURN_FORMATS:
            raise TaskSpecError(f"turn_format: must be one of {', '.join(TURN_FORMATS)}")
        if answer_prefix is not None and not isinstance(answer_prefix, bool):
            raise TaskSpecError("answer_prefix: must be true or false")
        if not isinstance(blinds, list | tuple) or len(blinds) != 2:
            raise TaskSpecError("blinds: must be [small, big], e.g. [1, 2]")
        big = _int("blinds", blinds[1], 1, 10_000)
        small = _int("blinds", blinds[0], 1, big)
        self.stack = _int("stack", stack, 2 * big, 1000 * big)
        if not isinstance(illegal_penalty, int | float) or isinstance(illegal_penalty, bool) \
                or not 0 <= illegal_penalty <= self.stack / big:
            raise TaskSpecError(f"illegal_penalty: must be a number of big blinds between 0 and the stack's "
                                f"{self.stack / big:g}")
        self.illegal_penalty = float(illegal_penalty)
        self.limit, self.blinds, self.opponent, self.turn_format = limit, (small, big), opponent, turn_format
        # A chat model given the opener copies an option; left to write it, it writes prose (docs/tasks.md, poker).
        self.answer_prefix = turn_format == "chatml" if answer_prefix is None else answer_prefix
        self.prefix = PREFIX if self.answer_prefix else ""
        self.return_range = (-self.stack / big - self.illegal_penalty, self.stack / big)  # an illegal answer at most
        pokerkit()  # refused here, with the extra to install, where PokerKit is missing

    def options(self) -> dict[str, Any]:
        return {"limit": self.limit, "blinds": list(self.blinds), "stack": self.stack, "opponent": self.opponent,
                "turn_format": self.turn_format, "answer_prefix": self.answer_prefix,
                "illegal_penalty": self.illegal_penalty}

    def header(self, seed: int, seat: int) -> str:
        return (f"Hand {seed}: heads-up {self.limit} hold'em, blinds {self.blinds[0]}/{self.blinds[1]}, stacks "
                f"{self.stack}. You are the {SEAT_NAMES[seat]}.\n")

    def advance(self, hand: Hand, max_turns: int) -> None:
        """Play the environment's opponent while it is to act; fold the agent when it is out of turns."""
        while not hand.over:
            if hand.actor != hand.agent and self.opponent != "self":
                hand.act(POLICIES[self.opponent](hand))
            elif hand.actor == hand.agent and hand.decisions[hand.agent] >= max_turns:
                hand.fold()
            else:
                return

    def first_message(self, hand: Hand) -> str:
        if hand.actor == hand.agent:
            return self.header(hand.seed, hand.agent) + hand.message(hand.agent)
        cards = " ".join(map(repr, hand.holes[hand.agent]))
        return self.header(hand.seed, hand.agent) + f"Your cards: {cards}. The opponent acts first."

    def deal(self, seed: int, seat: int) -> Hand:
        """Hand ``seed`` with the agent in ``seat``, the environment's opponent played up to the agent's turn."""
        hand = Hand(self, seed, seat)
        self.advance(hand, max_turns=1)
        return hand

    def sample_start(self, rng: random.Random) -> str:
        return self.first_message(self.deal(rng.randrange(2**31), rng.randrange(2)))

    def start(self, first_message: str) -> Hand | None:  # type: ignore[override]
        """The hand ``first_message`` describes (the environment's opponent played up to the agent's first
        decision); None when it is not one this game deals."""
        match = _HEAD.match(first_message)
        if match is None or match[0] != self.header(int(match[1]), SEAT_NAMES.index(match[6])):
            return None
        hand = self.deal(int(match[1]), SEAT_NAMES.index(match[6]))
        return hand if self.first_message(hand) == first_message else None

    def reply(self, message: str, *, answers: bool) -> tuple[str, str]:
        """An environment message as it is tokenized and as its tokens decode (special tokens skipped); when the
        reader ``answers`` it (a decision point, not the hand's end), the answer's opener follows it."""
        opening, closing = _TURN_HEADS[self.turn_format]
        raw = opening + message + closing + (self.prefix if answers else "")
        return raw, _SPECIAL.sub("", raw)

    def answer(self, text: str, start: int = 0) -> tuple[str | None, int]:
        """The answer of the turn at ``text[start:]`` and where it ends. With the opener written by the environment:
        the text up to ``</answer>`` or the end of the line (the environment's next message starts a line);
        without: the turn's first ``<answer>...</answer>``. None when there is none."""
        if not self.prefix:
            match = parse_action(text, start)
            return (match[1], match.end()) if match else (None, start)
        ends = [i for i in (text.find("</answer>", start), text.find("\n", start)) if i >= 0]
        end = min(ends, default=len(text))
        return text[start:end], end + len("</answer>") * text.startswith("</answer>", end)

    def max_completion_tokens(self, max_turns: int, max_new_tokens: int) -> int:
        """Every turn and the message after it, a first message in self-play, at one token per byte at worst
        (a message lists every action of the hand: 40 bytes each)."""
        message = REPLY_TOKENS + 40 * (2 * max_turns + 2) + len(self.prefix)
        return max_turns * (max_new_tokens + message) + message

    def play(self, task: Any, prompts: list[str], *, generate: Callable[[list[list[int]]], list[Turn]],
             encode: Callable[[str], list[int]], prompt_ids: list[list[int]] | None = None) -> list[Episode]:
        """Play one hand per prompt, all in lockstep: one ``generate`` call per round for every table's seat to
        act (the agent's context, or the self-play opponent's own)."""
        ids = prompt_ids if prompt_ids is not None else [encode(p) for p in prompts]
        end = encode("<|im_end|>") if self.turn_format == "chatml" else []
        if self.turn_format == "chatml" and len(end) != 1:
            raise TaskSpecError("turn_format: chatml needs a tokenizer with ChatML's <|im_start|> and <|im_end|> "
                                "tokens (SmolLM2, Qwen); use turn_format = \"plain\" with this model")
        tables = []
        for prompt, pids in zip(prompts, ids, strict=True):
            hand = task.start(prompt)
            first_user = prompt[len(SYSTEM) + 1:-1] if hand is not None else prompt
            table = _Table(hand, Episode(prompt=prompt, prompt_ids=list(pids), done=hand is None,
                                         messages=task.first_messages(first_user)))
            if hand is not None:
                table.agent_waits = hand.actor != hand.agent
                self._settle(task, table, encode, end)
                if self.prefix and not table.agent_waits and not hand.over:  # the agent opens: its turn's opener
                    _prefill(table.episode, encode(self.prefix), self.prefix)
            tables.append(table)
        for _ in range(2 * task.max_turns + 2):
            live = [t for t in tables if not t.episode.done]
            if not live:
                break
            agents = [t.hand.actor == t.hand.agent for t in live]
            contexts = [t.episode.prompt_ids + t.episode.completion_ids if mine else t.opponent_ids
                        for t, mine in zip(live, agents, strict=True)]
            for t, mine, turn in zip(live, agents, generate(contexts), strict=True):
                if mine:
                    t.episode.add_turn(turn)
                    t.episode.messages[-1]["content"] = self.prefix + turn.text  # the whole answer, as read
                    t.agent_waits = True
                else:
                    t.opponent_ids += turn.ids
                    t.opponent_waits = True
                t.hand.act(self.answer(turn.text)[0])
                self._settle(task, t, encode, end)
        return [self._finish(t) for t in tables]

    def _settle(self, task: Any, t: _Table, encode: Callable[[str], list[int]], end: list[int]) -> None:
        """After an action: the environment's opponent plays, then whoever acts next (or, at the hand's end, the
        agent) reads its message."""
        hand, ep = t.hand, t.episode
        self.advance(hand, task.max_turns)
        if hand.over or hand.actor == hand.agent:
            if t.agent_waits:
                raw, text = self.reply(hand.message(hand.agent), answers=not hand.over)
                if end and len(end) == 1 and ep.completion_ids[-1:] == end:
                    raw = raw.removeprefix("<|im_end|>")  # the turn ended at its end-of-turn token
                ep.add_reply(encode(raw), text, hand.message(hand.agent))
                t.agent_waits = False
            ep.done = hand.over
        elif t.opponent_waits:  # self-play: the opponent reads its own view
            seat = 1 - hand.agent
            if not t.opponent_ids:
                prompt = task.render_prompt(task.first_messages(self.header(hand.seed, seat) + hand.message(seat)))
                chat = self.turn_format == "chatml"
                t.opponent_ids = encode((f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
                                         if chat else prompt) + self.prefix)
            else:
                t.opponent_ids += encode(self.reply(hand.message(seat), answers=True)[0])
            t.opponent_waits = False

    def _finish(self, t: _Table) -> Episode:
        hand, ep = t.hand, t.episode
        if hand is not None:
            ep.reward = self.score(hand)
            ep.info = {"hand": hand.seed, "seat": hand.agent, "decisions": hand.decisions[hand.agent],
                       "illegal": hand.illegal[hand.agent], "opponent_return": hand.result(1 - hand.agent)}
        return ep

    def replay(self, task: Any, prompt: str, completion: str) -> float:
        """The agent's return, replayed from the transcript: each turn's answer (:meth:`answer`), the self-play
        opponent's answers as its messages list them; every message (and the opener of a first turn) must read as
        the environment writes it, else the lowest return (a transcript the environment did not write)."""
        hand = task.start(prompt)
        if hand is None:
            return 0.0
        head = _SPECIAL.sub("", _TURN_HEADS[self.turn_format][0]) + "Actions: "  # where each message starts
        pos, waits = 0, hand.actor != hand.agent
        if not waits and not hand.over:
            if not completion.startswith(self.prefix):
                return self.return_range[0]
            pos = len(self.prefix)
        for _ in range(4 * task.max_turns + 4):
            self.advance(hand, task.max_turns)
            if not hand.over and hand.actor != hand.agent:
                answer = self._opponent_answer(hand, completion, completion.find(head, pos) + len(head))
                if answer is None:
                    break
                hand.act(answer)
                continue
            if waits:
                text = self.reply(hand.message(hand.agent), answers=not hand.over)[1]
                at = completion.find(text, pos)
                if at < 0:
                    break
                pos, waits = at + len(text), False
            if hand.over:
                return self.score(hand)
            nxt, (answer, end) = completion.find(head, pos), self.answer(completion, pos)
            if answer is not None and 0 <= nxt < end:
                answer, end = None, pos  # no answer in this turn: the one found is in the environment's next message
            hand.act(answer)
            pos, waits = end, True
        return self.return_range[0]

    def score(self, hand: Hand) -> float:
        """The agent's return for a hand that is over: its chips in big blinds, less the penalty for an illegal answer
        (one at most: it folds the hand)."""
        return hand.result(hand.agent) - self.illegal_penalty * hand.illegal[hand.agent]

    @staticmethod
    def _opponent_answer(hand: Hand, completion: str, start: int) -> str | None:
        """The self-play opponent's next answer, read from the history line of the message at ``start``."""
        if start < len("Actions: "):
            return None
        line = completion[start:completion.find("\n", start)]
        acts = [m[1] for m in _OPPONENT_ACT.finditer(line)]
        known = sum(e.seat != hand.agent for e in hand.events)
        if len(acts) <= known:
            return None
        verb, *rest = acts[known].split()
        return " ".join([_VERBS[verb], *rest[-1:]])


def _prefill(episode: Episode, ids: list[int], text: str) -> None:
    """The environment's text at the start of the agent's first turn (its answer's opener): in the context, never
    learned (loss mask 0, log-prob 0), no message of its own: it is the start of the assistant's."""
    episode.completion_ids += ids
    episode.logprobs += [0.0] * len(ids)
    episode.loss_mask += [0] * len(ids)
    episode.text += text
