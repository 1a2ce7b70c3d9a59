"""The learner checks every record's prompt ids against the job's prompt format (learner/prompt_audit.py): a group
an honest engine built passes; prompt ids built another way (a BOS added by hand, the plain text of a chat job)
fail the audit with the ids side by side."""

from __future__ import annotations

import dataclasses

from dataplane.chat import PromptFormat, prompt_ids
from dataplane.replay import StoredGroup
from learner.prompt_audit import prompt_mismatches

from .test_audit import auditor, forged, honest_group


def test_an_honest_groups_prompt_ids_pass_and_other_ids_fail(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    audit = dataclasses.replace(auditor(tiny_model_dir, fraction=0.0),
                                encode=lambda prompt: prompt_ids(tokenizer, prompt))
    honest = honest_group(tiny_model_dir)
    bos = tokenizer.bos_token_id
    extra_bos = forged(honest, prompt_ids=lambda r: [bos, *r.prompt_ids])  # the engines' old hand-made BOS
    groups = [StoredGroup("1-0", honest), StoredGroup("2-0", extra_bos)]

    verdicts = audit.verdicts(groups)
    assert set(verdicts) == {"2-0"}
    verdict = verdicts["2-0"]
    assert verdict.problem.startswith("records.0.prompt_ids: not the ids the job's prompt format gives its prompt")
    assert verdict.evidence["check"] == "text" and not verdict.evidence["passed"]
    assert verdict.evidence["claimed_text"].startswith(f"{bos} {bos} ")
    kept, failed = audit.screen(groups, verdicts)
    assert [g.entry_id for g in kept] == ["1-0"] and failed == {0}


def test_a_chat_jobs_prompt_ids_are_the_template_s(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}={% endfor %}"
    fmt = PromptFormat(chat=True)
    plain = honest_group(tiny_model_dir)  # prompted as plain text: not what a chat job's engines send
    assert set(prompt_mismatches([StoredGroup("1-0", plain)], lambda p: prompt_ids(tokenizer, p, fmt))) == {"1-0"}
    chat = forged(plain, prompt_ids=lambda r: prompt_ids(tokenizer, r.prompt, fmt))
    assert prompt_mismatches([StoredGroup("2-0", chat)], lambda p: prompt_ids(tokenizer, p, fmt)) == {}
