"""dataplane/chat.py: the one way a prompt becomes token ids (plain: the tokenizer's own special tokens; chat: its
template with the job's system prompt), and the exported template that reproduces it."""

from __future__ import annotations

import pytest

from dataplane.chat import (
    PLAIN,
    PromptFormat,
    PromptFormatError,
    as_prompt_format,
    chat_messages,
    prompt_ids,
    template_with_system,
)
from dataplane.jobs import JobSpecError, parse_job_spec
from learner.tiny import build_tokenizer

TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")
ALPHABET = "0123456789+=[]abcdefghijklmnopqrstuvwxyz \n'\\{}%"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(ALPHABET)


@pytest.fixture(scope="module")
def chat_tokenizer():
    tok = build_tokenizer(ALPHABET)
    tok.chat_template = TEMPLATE
    return tok


def test_plain_is_what_the_tokenizer_itself_gives(tokenizer) -> None:
    ids = prompt_ids(tokenizer, "3+4=")
    assert ids == tokenizer("3+4=")["input_ids"]  # what a user of the exported tokenizer writes
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1  # its own BOS, once
    assert tokenizer.decode(ids, skip_special_tokens=True) == "3+4="


def test_chat_is_the_template_with_the_system_prompt(chat_tokenizer) -> None:
    fmt = PromptFormat(chat=True, system_prompt="be brief")
    ids = prompt_ids(chat_tokenizer, "3+4=", fmt)
    rendered = "[system]be brief\n[user]3+4=\n[assistant]"
    assert chat_tokenizer.decode(ids, skip_special_tokens=True) == rendered
    assert ids.count(chat_tokenizer.bos_token_id) == 1  # the template's BOS, not one more from the tokenizer
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+4="}]
    assert ids == chat_tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]


def test_chat_without_a_system_prompt_and_with_whole_chats(chat_tokenizer) -> None:
    fmt = PromptFormat(chat=True)
    assert chat_tokenizer.decode(prompt_ids(chat_tokenizer, "1+1=", fmt), skip_special_tokens=True) == \
        "[user]1+1=\n[assistant]"
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "2"}]
    assert chat_messages(own, PromptFormat(chat=True, system_prompt="job's")) == own  # its own system message kept
    with pytest.raises(PromptFormatError, match="chat = true"):
        prompt_ids(chat_tokenizer, own, PLAIN)


def test_a_chat_job_on_a_tokenizer_without_a_template_says_so(tokenizer) -> None:
    with pytest.raises(PromptFormatError, match="no chat template"):
        prompt_ids(tokenizer, "1+1=", PromptFormat(chat=True))


@pytest.mark.parametrize("system", ["be brief", "it's {% raw %} a \\ test\nline two", "{{ 1 }} '' %}"])
def test_the_exported_template_holds_the_system_prompt(chat_tokenizer, system: str) -> None:
    fmt = PromptFormat(chat=True, system_prompt=system)
    template = template_with_system(TEMPLATE, system)
    user = [{"role": "user", "content": "3+4="}]
    assert chat_tokenizer.apply_chat_template(user, chat_template=template, add_generation_prompt=True,
                                              tokenize=False) == \
        chat_tokenizer.apply_chat_template(chat_messages("3+4=", fmt), add_generation_prompt=True, tokenize=False)
    own = [{"role": "system", "content": "mine"}, *user]  # a user's own system message replaces the job's
    assert "mine" in chat_tokenizer.apply_chat_template(own, chat_template=template, tokenize=False)
    assert system not in chat_tokenizer.apply_chat_template(own, chat_template=template, tokenize=False)


def test_the_job_setting() -> None:
    base = {"name": "j", "model_dir": "/m", "task": {"name": "arithmetic"}}
    assert parse_job_spec(base).prompt_format == PLAIN
    spec = parse_job_spec({**base, "prompt_format": {"chat": True, "system_prompt": "be brief"}})
    assert spec.prompt_format == PromptFormat(chat=True, system_prompt="be brief")
    assert as_prompt_format(spec.model_dump(mode="json")["prompt_format"]) == spec.prompt_format
    assert as_prompt_format(None) == PLAIN  # an older site's assignment
    with pytest.raises(JobSpecError) as err:
        parse_job_spec({**base, "prompt_format": {"chta": True}})
    assert err.value.errors == [("prompt_format.chta", "unknown key (did you mean prompt_format.chat?)")]
    with pytest.raises(JobSpecError) as err:
        parse_job_spec({**base, "prompt_format": {"system_prompt": "x"}})
    assert err.value.errors == [("prompt_format.system_prompt", "a system prompt needs chat: true (a plain prompt "
                                 "has no system message)")]


def test_the_site_allows_the_format_its_tokens() -> None:
    plain, chat = PLAIN.token_allowance(), PromptFormat(chat=True, system_prompt="é" * 10).token_allowance()
    assert chat == plain + 512 + 20


def test_a_chat_prompt_longer_than_its_text_passes_the_record_checks(chat_tokenizer) -> None:
    from dataplane.records import RecordLimits, Trajectory, record_problem

    fmt = PromptFormat(chat=True, system_prompt="answer with the sum and nothing else")
    ids = prompt_ids(chat_tokenizer, "3+4=", fmt)
    rec = Trajectory(job_id=1, lease_id="l", group_id="g", prompt="3+4=", prompt_ids=ids, completion="7",
                     completion_ids=[5, 2], logprobs=[-1.0, -1.0], reward=1.0, version=0)
    assert "prompt_ids" in record_problem(rec, RecordLimits())  # the plain allowance: 16 tokens beyond the text
    assert record_problem(rec, RecordLimits(prompt_extra_tokens=fmt.token_allowance())) == ""
