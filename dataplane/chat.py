"""The token ids of a prompt: one function for the learner, every engine and the export.

A model sees during RL the ids built here, and a user of the exported model must be able to build the same ids
with plain ``transformers``. So the ids come only from what the tokenizer itself knows, never from a convention of
ours (the engines once put a BOS in front by hand, which a user calling ``tokenizer(prompt)`` did not get: 4 sums
of 25 right instead of 24):

- **plain** (``PromptFormat(chat=False)``, the default): ``tokenizer(prompt, add_special_tokens=True)``, the
  tokenizer's own special tokens (its post-processor: a BOS for Llama-style tokenizers, nothing for Qwen's); what
  ``tokenizer(prompt)`` gives, since ``add_special_tokens`` defaults to true;
- **chat** (``PromptFormat(chat=True, system_prompt=...)``): the task's prompt as the user message, after the job's
  system message if it has one, rendered by the tokenizer's chat template with ``add_generation_prompt=True`` and
  tokenized without adding special tokens (the template writes them), as ``tokenizer.apply_chat_template(messages,
  add_generation_prompt=True)`` does.

Tokenizers are passed in as objects (a ``transformers`` tokenizer): this module imports neither transformers nor
torch. The export writes the job's system prompt into the exported chat template (:func:`template_with_system`),
so that ``apply_chat_template`` on the user's message alone gives the trained ids (dataplane/export.py).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_SYSTEM_PROMPT_CHARS = 16_384
#: Tokens a chat template may add around the messages (role markers, a default system prompt or date line that
#: the template writes itself): what the site allows beyond the prompt's and the system prompt's bytes.
CHAT_TEMPLATE_TOKENS = 512

Message = dict[str, str]

#: How a prompt that is a whole chat (a conversational data set's row, a verifiers task with a system prompt: system,
#: user, ... messages) travels where a prompt is a text (leases, records): this mark, then the messages as JSON. A
#: chat job renders them with the chat template, every role kept (:func:`chat_messages`); a plain job reads their
#: contents, a line each (:func:`flatten_chat`).
CHAT_MARK = "\x1echat:"


class PromptFormatError(ValueError):
    """A prompt the tokenizer cannot build as the job asks (a chat job on a tokenizer without a chat template)."""


class PromptFormat(BaseModel):
    """How a task's prompt text becomes the model's input: the job setting ``prompt_format``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chat: bool = Field(
        default=False, description="true: the prompt is the user message of a chat, rendered by the tokenizer's "
        "chat template with add_generation_prompt (an instruct model); false: the prompt text as is, with the "
        "tokenizer's own special tokens (a base model: what tokenizer(prompt) gives).")
    system_prompt: str | None = Field(
        default=None, min_length=1, max_length=MAX_SYSTEM_PROMPT_CHARS, description="The system message before "
        "every prompt of a chat job (chat only); null: none, or the chat template's own default. The export "
        "writes it into the exported chat template.")

    @model_validator(mode="after")
    def _system_needs_chat(self) -> PromptFormat:
        if self.system_prompt is not None and not self.chat:
            raise ValueError("system_prompt: a system prompt needs chat: true (a plain prompt has no system message)")
        return self

    def token_allowance(self) -> int:
        """The most token ids this format adds to a prompt's own (at most one per UTF-8 byte): special tokens, and
        for chat the system prompt and the template's markers. Needs no tokenizer, so the site can check it."""
        from .records import PROMPT_SPECIAL_TOKENS

        if not self.chat:
            return PROMPT_SPECIAL_TOKENS
        return PROMPT_SPECIAL_TOKENS + CHAT_TEMPLATE_TOKENS + len((self.system_prompt or "").encode("utf-8"))


PLAIN = PromptFormat()


def as_prompt_format(value: PromptFormat | dict[str, Any] | None) -> PromptFormat:
    """A job's ``prompt_format`` as it travels (a JobSpec's, a dict of an assignment or saved config, None from an
    older site: plain)."""
    if value is None:
        return PLAIN
    return value if isinstance(value, PromptFormat) else PromptFormat.model_validate(value)


def encode_chat(messages: list[Message]) -> str:
    """``messages`` as one prompt text (:data:`CHAT_MARK`); :func:`decode_chat` gives them back."""
    return CHAT_MARK + json.dumps([{"role": m["role"], "content": m["content"]} for m in messages],
                                  ensure_ascii=False, separators=(",", ":"))


def decode_chat(prompt: str) -> list[Message] | None:
    """The messages of a prompt text :func:`encode_chat` wrote; None for a plain text."""
    if not prompt.startswith(CHAT_MARK):
        return None
    try:
        messages = json.loads(prompt[len(CHAT_MARK):])
    except ValueError:
        return None
    ok = isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                            and isinstance(m.get("content"), str) for m in messages)
    return messages if ok else None


def flatten_chat(messages: list[Message]) -> str:
    """A chat as one plain text (a base model's prompt): each message's content and a newline."""
    return "".join(f"{m['content']}\n" for m in messages)


def chat_messages(prompt: str | list[Message], fmt: PromptFormat) -> list[Message]:
    """The chat of ``prompt``: the job's system message (unless the messages bring their own), then the prompt as
    the user's message, or the messages themselves (an environment or a data set that writes whole chats, as a list
    or as :func:`encode_chat`'s text)."""
    if isinstance(prompt, str):
        prompt = decode_chat(prompt) or prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if fmt.system_prompt is not None and (not messages or messages[0].get("role") != "system"):
        messages.insert(0, {"role": "system", "content": fmt.system_prompt})
    return messages


def check_tokenizer(tokenizer: Any, fmt: PromptFormat) -> None:
    """Raise :class:`PromptFormatError` when ``tokenizer`` cannot build ``fmt``'s prompts (the learner checks it
    before training, so a job that cannot work fails at once with the reason)."""
    if fmt.chat and not getattr(tokenizer, "chat_template", None):
        raise PromptFormatError("prompt_format.chat: the model's tokenizer has no chat template (a base model); "
                                "set prompt_format.chat = false, or use an instruct model")


def prompt_text(tokenizer: Any, prompt: str | list[Message], fmt: PromptFormat = PLAIN) -> str:
    """The text the model is prompted with: ``prompt`` itself (plain), or the rendered chat (its special tokens
    written by the template)."""
    if not fmt.chat:
        if not isinstance(prompt, str):
            raise PromptFormatError("a chat (a list of messages) needs prompt_format.chat = true")
        messages = decode_chat(prompt)  # a chat written as a text: a base model reads its contents, a line each
        return prompt if messages is None else flatten_chat(messages)
    check_tokenizer(tokenizer, fmt)
    return tokenizer.apply_chat_template(chat_messages(prompt, fmt), tokenize=False, add_generation_prompt=True)


def prompt_ids(tokenizer: Any, prompt: str | list[Message], fmt: PromptFormat | None = None) -> list[int]:
    """The token ids of ``prompt`` under ``fmt`` (default plain): what every engine generates from, the learner
    checks and trains on, and the exported tokenizer gives (``tokenizer(prompt)``, or ``apply_chat_template``
    with ``add_generation_prompt=True`` for a chat job)."""
    fmt = fmt or PLAIN
    text = prompt_text(tokenizer, prompt, fmt)
    return list(tokenizer(text, add_special_tokens=not fmt.chat)["input_ids"])


def template_with_system(template: str, system_prompt: str) -> str:
    """``template`` with ``system_prompt`` as its default system message: a chat without a system message gets it
    first, a chat with one keeps its own. What the export writes, so ``apply_chat_template([user])`` gives the
    ids the job trained on."""
    quoted = system_prompt.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    head = ("{%- if not messages or messages[0]['role'] != 'system' -%}"
            f"{{%- set messages = [{{'role': 'system', 'content': '{quoted}'}}] + messages -%}}"
            "{%- endif -%}")
    return head + template


#: The files of a Hugging Face checkpoint that may hold its chat template (transformers reads the first it finds).
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def exported_template_files(files: dict[str, bytes], fmt: PromptFormat) -> dict[str, bytes]:
    """The tokenizer files of an export (``files``: name -> bytes, of :data:`TEMPLATE_FILES` those the base has)
    rewritten so that plain ``transformers`` builds the prompts ``fmt`` trained on: a chat job's system prompt
    becomes its chat template's default system message (:func:`template_with_system`), in every file holding a
    template. Only the changed files are returned; a plain job (``tokenizer(prompt)`` already gives the trained
    ids) or a chat job without a system prompt changes none. Raises :class:`PromptFormatError` when a chat job's
    base has no template to write into."""
    if not fmt.chat or fmt.system_prompt is None:
        return {}
    changed: dict[str, bytes] = {}
    for name, data in files.items():
        if name == "chat_template.jinja":
            changed[name] = template_with_system(data.decode("utf-8"), fmt.system_prompt).encode("utf-8")
            continue
        try:
            config = json.loads(data)
        except ValueError as err:
            raise PromptFormatError(f"{name} of the base is not JSON: {err}") from None
        found = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(found, str):
            config["chat_template"] = template_with_system(found, fmt.system_prompt)
        elif isinstance(found, list):  # named templates: [{"name": "default", "template": "..."}, ...]
            config["chat_template"] = [{**t, "template": template_with_system(t["template"], fmt.system_prompt)}
                                       if isinstance(t, dict) and isinstance(t.get("template"), str) else t
                                       for t in found]
        else:
            continue
        changed[name] = (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    if not changed:
        raise PromptFormatError("prompt_format.chat: the base model has no chat template (chat_template.jinja, or "
                                "chat_template in tokenizer_config.json) to write the system prompt into")
    return changed
