"""Issue 28: an exported model, prompted with plain ``transformers`` as docs/cli.md shows, sees the token stream it
was trained on, so it answers as the engine does. For a plain job ``tokenizer(prompt)``; for a chat job
``tokenizer.apply_chat_template([user message], add_generation_prompt=True)``, the job's system prompt written into
the exported template. The learner, the HF engine and the export build the same prompt ids (dataplane/chat.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load

from dataplane.broadcast.store import read_version, version_dir
from dataplane.chat import PLAIN, PromptFormat, prompt_ids
from dataplane.snapshot import assemble
from dataplane.tasks import build_task
from learner.export import export_version
from learner.tiny import build_tiny_model
from worker_agent.engines.base import SamplingParams
from worker_agent.engines.hf import HFEngine

from .helpers import trained_snapshots

TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")
PROMPTS = ["3+4=", "1+2=", "5+5=", "9+0=", "2+7="]  # one length: the engine batches them without padding
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
CHAT = PromptFormat(chat=True, system_prompt="add the two numbers")


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """A tiny model whose tokenizer has a chat template (an 'instruct' model, built here: no download)."""
    from transformers import AutoTokenizer

    alphabet = build_task({"name": "arithmetic"}).alphabet + "[]abcdefghijklmnopqrstuvwxyz \n"
    path = build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-chat", alphabet=alphabet, hidden=32, layers=1)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def _trained_export(model_dir, tmp_path, fmt: PromptFormat, job: int):
    """A trained version (2) of ``model_dir`` exported by ``echo2-learner export``'s code, the prompt format read
    from the run configuration the learner saved; and the engine holding the same weights, as a worker's does."""
    root = tmp_path / "snapshots"
    _, store = trained_snapshots(model_dir, root / f"job{job}", job)
    saved = root / f"job{job}-checkpoint"
    saved.mkdir(parents=True)
    (saved / "run-config.json").write_text(json.dumps({"job": {"prompt_format": fmt.model_dump()}}))
    written = export_version(root, job, tmp_path / "out")
    assert written["prompt_format"] == fmt.model_dump()
    engine = HFEngine(str(model_dir), device="cpu", prompt_format=fmt)
    manifest, chunks = read_version(version_dir(store.root, 2))
    engine.load_weights(load(assemble(manifest, chunks)))
    return tmp_path / "out", engine


def _exported_greedy(out, prompts: list[str], fmt: PromptFormat) -> tuple[list[list[int]], list[list[int]]]:
    """What a user of the export does, with plain transformers: (the prompt ids, the greedy completion ids up to
    and with the eos)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    all_ids, answers = [], []
    for prompt in prompts:
        if fmt.chat:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_dict=True)["input_ids"]
        else:
            ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            out_ids = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=GREEDY.max_new_tokens, do_sample=False)
        new = out_ids[0, len(ids):].tolist()
        if tokenizer.eos_token_id in new:
            new = new[:new.index(tokenizer.eos_token_id) + 1]
        all_ids.append(list(ids))
        answers.append(new)
    return all_ids, answers


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_the_exported_model_answers_as_the_engine_does(tiny_model_dir, chat_model_dir, tmp_path, chat) -> None:
    from transformers import AutoTokenizer

    model_dir, fmt = (chat_model_dir, CHAT) if chat else (tiny_model_dir, PLAIN)
    out, engine = _trained_export(model_dir, tmp_path, fmt, job=7)
    exported_ids, exported_answers = _exported_greedy(out, PROMPTS, fmt)
    completions = [group[0] for group in engine.generate(PROMPTS, n=1, params=GREEDY)]

    learner_tokenizer = AutoTokenizer.from_pretrained(model_dir)  # what the learner's audit builds ids with
    for prompt, ids, completion in zip(PROMPTS, exported_ids, completions, strict=True):
        assert ids == completion.prompt_ids == engine.encode_prompt(prompt)
        assert ids == prompt_ids(learner_tokenizer, prompt, fmt)
    assert exported_answers == [c.completion_ids for c in completions]
    if not chat:  # the prompts matter (behind the chat's long head this random model answers them all alike)
        assert len({tuple(a) for a in exported_answers}) > 1
    else:
        text = learner_tokenizer.decode(exported_ids[0], skip_special_tokens=True)
        assert text == "[system]add the two numbers\n[user]3+4=\n[assistant]"


def test_tokenizer_of_the_export_gives_the_engines_ids_without_a_hand_made_bos(tiny_model_dir, tmp_path) -> None:
    """docs/cli.md's ``tokenizer(prompt)`` on the exported tokenizer gives the ids the engine generated from: before
    issue 28 the engines put a BOS in front by hand and the exported tokenizer did not (4 of 25 sums right)."""
    from transformers import AutoTokenizer

    out, engine = _trained_export(tiny_model_dir, tmp_path, PLAIN, job=8)
    tokenizer = AutoTokenizer.from_pretrained(out)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        assert ids == engine.encode_prompt(prompt)
        assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
