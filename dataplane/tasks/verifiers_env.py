"""Environments written for ``verifiers`` (0.4, ``verifiers.v1``; the format of prime-rl's environment hub).

``{"name": "verifiers", "env": "pkg.module:load_environment", "args": {...}, "size": 1000, "max_turns": 1}``:
``load_environment(**args)`` returns a ``vf.Taskset`` (or a ``vf.Env``, whose ``taskset`` is used). Its first
``size`` tasks are the prompts; each task is scored by its own rubric, the ``@vf.reward`` methods of its
``vf.Task`` (``task.score(trace)``, the weighted sum ``trace.reward``), on a ``vf.Trace`` holding the
conversation. verifiers' own rollout (an ``Env`` driving a harness through an OpenAI-compatible interception
server) is not used: a worker samples with its own engine, which is what the record's token ids and behaviour
log-probs must come from.

The prompt is the task's messages (its ``system_prompt``, then its ``prompt``: a string as one user message, or a
list of messages): a lone user message as its text and a newline, as the ``sandbox`` task renders its
conversation; a chat of several turns as :func:`dataplane.chat.encode_chat`'s text, so that a chat job
(``prompt_format.chat``) renders it with the model's chat template, the system turn kept (a plain job reads each
message's text and a newline, as before). A worker knows only that text, so the learner and every worker keep the
index prompt -> task, rebuilt alike from the same spec.

**Multi-turn** (``max_turns`` > 1): the environment answers each assistant turn through
``env_response(messages, task)`` (a method of the loaded environment or of its taskset: the role of
``MultiTurnEnv.env_response`` in earlier verifiers): a text (a user message), a message ``{"role": "user" |
"tool", "content": ...}`` (a tool's may carry ``tool_call_id`` and ``name``) or a list of them; ``None`` ends the
episode. Plays continue until it ends or ``max_turns`` assistant turns are taken; the conversation keeps each
reply's role (the rubric scores a trace with verifiers' ``ToolMessage``), and the completion is the assistant turns
and the replies with the turn-aware loss mask of dataplane/tasks/sandbox.py (1 on assistant tokens, 0 on the
replies'). ``turn_format`` says how a reply is written in the tokens: ``plain`` (each message's text between
newlines, ``"\\n<reply>\\n"``) or ``chatml`` (each message a ChatML turn of its role, ``<|im_start|>tool``, for a
chat job on a ChatML model). :meth:`VerifiersTask.reward` replays the transcript: each turn ends where the reply
the environment gives to it follows.

**User code.** The environment is the job owner's code: it is imported by :meth:`VerifiersTask.prepare` with
``allow_user_code`` (the agent passes the provider's ``echo2-agent run --allow-user-code``, the learner true), or on
first use in a process that set ``ECHO2_ALLOW_USER_CODE=1``; never on the site (building the adapter from a spec
imports nothing). Refused, it raises :class:`~dataplane.rewards.UserCodeRefused` and the agent refuses the job.
With ``code`` (a code package's digest, dataplane/usercode.py) it imports from that package, which the agent
fetched with the job's data: the workers need no copy installed.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..chat import decode_chat, encode_chat, flatten_chat
from ..rewards import UserCodeRefused
from ..rewards.reward import import_owner_module
from ..usercode import CodeError, activate, deactivate, parse_code
from .base import Prompt, TaskAdapter, TaskSpecError, register_task
from .episodes import Episode, Reply, Turn, play_lockstep

INSTALL = "pip install 'echo2[verifiers]'"
#: Set to 1 in a process that runs a job's environment code without :meth:`VerifiersTask.prepare` (tests, benches).
ALLOW_USER_CODE = "ECHO2_ALLOW_USER_CODE"
REPLY_TOKENS = 1024  # the most tokens of one environment reply in a completion
_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
TURN_FORMATS = ("plain", "chatml")
REPLY_ROLES = ("user", "tool")  # who may answer an assistant turn
_SPECIAL = re.compile(r"<\|im_(?:start|end)\|>")


__all__ = ["ALLOW_USER_CODE", "UserCodeRefused", "VerifiersTask"]


def user_code_allowed() -> bool:
    """Whether this process said it runs a job's own code (``ECHO2_ALLOW_USER_CODE=1``; docs/trust.md)."""
    return os.environ.get(ALLOW_USER_CODE, "") == "1"


def render(messages: list[dict[str, str]]) -> str:
    """A task's opening messages as its prompt text: a lone user message as its text and a newline (as the sandbox
    task); with a system (or any other) turn, the chat itself (:func:`dataplane.chat.encode_chat`), which a chat job
    renders with the chat template, roles kept, and a plain job reads as each message's text and a newline."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return flatten_chat(messages)
    return encode_chat(messages)


def run_async(coro_fn: Callable[[], Any]) -> Any:
    """Run the coroutine ``coro_fn()`` to its end, from plain code or from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    with ThreadPoolExecutor(1) as pool:  # an agent's event loop: verifiers' scoring gets a loop of its own
        return pool.submit(lambda: asyncio.run(coro_fn())).result()


@register_task
class VerifiersTask(TaskAdapter):
    name = "verifiers"

    def __init__(self, *, env: str = "", args: dict[str, Any] | None = None, size: int = 1000, max_turns: int = 1,
                 reward_range: list[float] | tuple[float, float] = (0.0, 1.0), code: Any = None,
                 turn_format: str = "plain") -> None:
        if not isinstance(env, str) or not _REF.match(env):
            raise TaskSpecError("env: name the environment's loader as 'pkg.module:load_environment'")
        try:
            self.code = parse_code(code)
        except CodeError as err:
            raise TaskSpecError(str(err)) from None
        args = {} if args is None else args
        if not isinstance(args, dict) or any(not isinstance(k, str) for k in args):
            raise TaskSpecError("args: must be an object of keyword arguments of the loader")
        for field, value, high in (("size", size, 100_000), ("max_turns", max_turns, 100)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise TaskSpecError(f"{field}: must be an integer between 1 and {high}")
        if (not isinstance(reward_range, list | tuple) or len(reward_range) != 2
                or not all(isinstance(v, int | float) and math.isfinite(v) for v in reward_range)
                or not reward_range[0] < reward_range[1]):
            raise TaskSpecError("reward_range: must be [low, high] with low < high (the rubric's weighted sum)")
        if turn_format not in TURN_FORMATS:
            raise TaskSpecError(f"turn_format: must be one of {', '.join(TURN_FORMATS)}")
        self.turn_format = turn_format
        self.env, self.args, self.size, self.max_turns = env, dict(args), size, max_turns
        self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        self.multi_turn = max_turns > 1
        self._loaded: tuple[Any, dict[str, Any], Callable | None] | None = None
        self._allowed = False  # prepare(allow_user_code=True) was called

    def spec(self) -> dict[str, Any]:
        code = {"code": self.code} if self.code else {}
        turns = {"turn_format": self.turn_format} if self.turn_format != "plain" else {}
        return {"name": self.name, "env": self.env, "args": dict(self.args), "size": self.size,
                "max_turns": self.max_turns, "reward_range": list(self.reward_range), **turns, **code}

    def max_completion_tokens(self, max_new_tokens: int) -> int:
        return max_new_tokens if not self.multi_turn else self.max_turns * (max_new_tokens + REPLY_TOKENS)

    # -- the environment (user code, loaded by prepare or on first use) -------------------------------------------

    def user_code(self) -> list[str]:
        return [self.env]  # the environment is the owner's code, whatever it loads

    def prepare(self, *, allow_user_code: bool) -> None:
        """Load the environment, if this machine runs user code (else :class:`UserCodeRefused`)."""
        self._allowed = allow_user_code
        self._load()

    def _load(self) -> tuple[Any, dict[str, Any], Callable | None]:
        """``(taskset, prompt text -> task, env_response or None)``, loaded once."""
        if self._loaded is None:
            if not (self._allowed or user_code_allowed()):
                raise UserCodeRefused(f"env: runs the job's own code ({self.env}) and this machine did not opt in "
                                      "(`echo2-agent run --allow-user-code`)")
            try:
                import verifiers.v1  # noqa: F401 - the format the environment is written in
            except ImportError:
                raise TaskSpecError(f"env: the verifiers task needs verifiers ({INSTALL})") from None
            try:  # the environment imports from the job's code package, where this machine holds it; never from an
                if self.code:  # earlier job's
                    activate(self.code)
                else:
                    deactivate()
            except CodeError as err:
                raise TaskSpecError(str(err)) from None
            environment = _call_loader(self.env, self.args)
            taskset = getattr(environment, "taskset", environment)
            index: dict[str, Any] = {}
            try:
                for task, _ in zip(taskset, range(self.size), strict=False):
                    index.setdefault(render(first_messages(task)), task)
            except Exception as err:  # noqa: BLE001 - the taskset is user code
                raise TaskSpecError(f"env: its taskset failed: {type(err).__name__}: {err}") from None
            if not index:
                raise TaskSpecError("env: its taskset has no task")
            respond = getattr(environment, "env_response", None) or getattr(taskset, "env_response", None)
            if self.multi_turn and respond is None:
                raise TaskSpecError("max_turns: more than 1 needs the environment's env_response(messages, task)")
            self._loaded = (taskset, index, respond)
        return self._loaded

    @property
    def alphabet(self) -> str:  # type: ignore[override]
        """Characters of the prompts (for tiny tokenizers); loads the environment."""
        texts = (flatten_chat(decode_chat(p) or []) or p for p in self._load()[1])
        return "".join(sorted(set("".join(texts) + "\n")))

    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        prompts = list(self._load()[1])
        return [Prompt(text=rng.choice(prompts)) for _ in range(count)]

    def task_of(self, prompt: str) -> Any | None:
        """The environment's task ``prompt`` was rendered from; None for a prompt it could not have produced."""
        return self._load()[1].get(prompt)

    # -- scoring: the task's rubric on a trace of the conversation ------------------------------------------------

    def score(self, task: Any, messages: list[dict[str, str]]) -> float:
        """The rubric's weighted sum for ``messages``; 0 when a reward function fails, clipped to the range."""
        try:
            value = float(run_async(lambda: _score(task, messages)))
        except Exception:  # noqa: BLE001 - the rubric is user code: its failure scores the answer 0
            return 0.0
        low, high = self.reward_range
        return min(max(value, low), high) if math.isfinite(value) else 0.0

    def reward(self, prompt: str, completion: str) -> float:
        task = self.task_of(prompt)
        if task is None:
            return 0.0
        messages = first_messages(task)
        if not self.multi_turn:
            return self.score(task, [*messages, {"role": "assistant", "content": completion}])
        return self.score(task, self.replay(task, messages, completion))

    def replay(self, task: Any, messages: list[dict[str, str]], completion: str) -> list[dict[str, str]]:
        """The conversation of a multi-turn transcript: each assistant turn ends at the first point where the
        environment's reply to it follows (``"\\n<reply>\\n"``); the rest of the text is the last turn."""
        respond, pos = self._load()[2], 0
        for _ in range(self.max_turns - 1):
            for end in (i for i, ch in enumerate(completion) if ch == "\n" and i >= pos):
                turn = [*messages, {"role": "assistant", "content": completion[pos:end]}]
                reply = _respond(respond, turn, task)
                text = self.render_reply(reply)[1] if reply is not None else None
                if text is not None and completion.startswith(text, end):
                    messages = [*turn, *reply]
                    pos = end + len(text)
                    break
            else:
                break
        return [*messages, {"role": "assistant", "content": completion[pos:]}]

    def render_reply(self, messages: list[dict[str, str]]) -> tuple[str, str]:
        """The environment's reply as it is tokenized and as its tokens decode (special tokens skipped, as the
        learner's audit decodes them). ``plain``: each message's text between newlines, whatever its role;
        ``chatml``: the assistant turn closed, each message a ChatML turn of its own role (``user``, ``tool``), then
        the next assistant turn opened: the model reads a tool's result as its chat template writes one."""
        if self.turn_format == "plain":
            text = "".join(f"\n{m['content']}\n" for m in messages)
            return text, text
        raw = "<|im_end|>\n" + "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) \
            + "<|im_start|>assistant\n"
        return raw, _SPECIAL.sub("", raw)

    # -- multi-turn episodes --------------------------------------------------------------------------------------

    def play(self, prompts: list[str], *, generate: Callable[[list[list[int]]], list[Turn]],
             encode: Callable[[str], list[int]], prompt_ids: list[list[int]] | None = None) -> list[Episode]:
        """Play one episode per prompt in lockstep (dataplane/tasks/sandbox.py's contract); the return is the
        rubric's score of the whole conversation."""
        respond = self._load()[2]
        ids = prompt_ids if prompt_ids is not None else [encode(p) for p in prompts]
        end = encode("<|im_end|>") if self.turn_format == "chatml" else []
        if self.turn_format == "chatml" and len(end) != 1:
            raise TaskSpecError("turn_format: chatml needs a tokenizer with ChatML's <|im_start|> and <|im_end|> "
                                "tokens (SmolLM2, Qwen); use turn_format = \"plain\" with this model")
        tasks = [self.task_of(p) for p in prompts]
        episodes = [Episode(prompt=p, prompt_ids=list(i), messages=first_messages(t) if t is not None else [],
                            done=t is None) for p, i, t in zip(prompts, ids, tasks, strict=True)]

        def react(i: int, ep: Episode, turn: Turn) -> Reply | None:
            reply = _respond(respond, ep.messages, tasks[i]) if ep.turns < self.max_turns else None
            if reply is None:
                return None
            raw, text = self.render_reply(reply)
            if end and ep.completion_ids[-1:] == end:
                raw = raw.removeprefix("<|im_end|>")  # the turn ended at its end-of-turn token
            return Reply(raw=raw, text=text, messages=reply)

        play_lockstep(episodes, max_turns=self.max_turns, generate=generate, encode=encode, react=react)
        for ep, task in zip(episodes, tasks, strict=True):
            ep.reward = self.score(task, ep.messages) if task is not None and ep.turns else 0.0
        return episodes


def first_messages(task: Any) -> list[dict[str, str]]:
    """A verifiers task's opening messages as ``{"role", "content"}`` (its system prompt, then its prompt)."""
    from verifiers.v1.types import content_text

    data = task.data
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    for message in data.prompt or []:
        role = message["role"] if isinstance(message, dict) else message.role
        content = message["content"] if isinstance(message, dict) else message.content
        messages.append({"role": role, "content": content if isinstance(content, str) else content_text(content)})
    return messages


def _respond(respond: Callable | None, messages: list[dict[str, str]], task: Any) -> list[dict[str, str]] | None:
    """The environment's reply to the conversation so far, as messages: ``env_response`` returns a text (one user
    message), a message ``{"role": "user" | "tool", "content": text}`` (a tool's may carry ``tool_call_id`` and
    ``name``) or a list of them. None ends the episode: so does a reply of another shape, or env_response failing."""
    if respond is None:
        return None
    try:
        reply = respond([dict(m) for m in messages], task)
    except Exception:  # noqa: BLE001 - user code: a failing environment ends the episode
        return None
    if isinstance(reply, str):
        return [{"role": "user", "content": reply}]
    replies = [reply] if isinstance(reply, dict) else reply
    if not isinstance(replies, list) or not replies:
        return None
    out = []
    for m in replies:
        if not (isinstance(m, dict) and m.get("role") in REPLY_ROLES and isinstance(m.get("content"), str)):
            return None
        out.append({k: v for k, v in m.items() if k in ("role", "content", "tool_call_id", "name")
                    and isinstance(v, str)})
    return out


def _call_loader(ref: str, args: dict[str, Any]) -> Any:
    module_name, _, attr_path = ref.partition(":")
    try:
        target: Any = import_owner_module(module_name)  # from the path, else the working directory
        for attr in attr_path.split("."):
            target = getattr(target, attr)
        return target(**args)
    except Exception as err:  # noqa: BLE001 - importing and calling user code: any failure is a bad spec
        raise TaskSpecError(f"env: cannot load {ref!r}: {type(err).__name__}: {err}") from None


async def _score(task: Any, messages: list[dict[str, str]]) -> float:
    """``task.score`` on a trace of ``messages`` (one node per message, assistant messages sampled)."""
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask

    nodes = [MessageNode(message=_vf_message(vf, m), parent=i - 1 if i else None, sampled=m["role"] == "assistant")
             for i, m in enumerate(messages)]
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data),
                     agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes, is_completed=True, ok=True)
    await task.score(trace)
    return trace.reward


def _vf_message(vf: Any, message: dict[str, str]) -> Any:
    """A conversation's message as verifiers' own type: a tool's result keeps its call id (``call_0`` if the
    environment gave none) and its tool's name."""
    if message["role"] == "tool":
        return vf.ToolMessage(content=message["content"], tool_call_id=message.get("tool_call_id") or "call_0",
                              name=message.get("name"))
    kinds = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
    return kinds[message["role"]](content=message["content"])
