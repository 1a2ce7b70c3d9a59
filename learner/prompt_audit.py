"""The learner's check of every record's prompt ids: they must be the ids the job's prompt format builds from its
prompt text (:func:`dataplane.chat.prompt_ids`, what every engine generates from).

The site checks that a returned group answers the leased prompt text, and bounds its prompt ids' length, but cannot
tokenize; the learner can. A group whose prompt ids are not those of its prompt (a worker that prompted the model
otherwise, or forged the context) would train the policy on a stream nobody prompts it with, so it fails its audit
like a completion whose text is not its ids (learner/audit.py, the ``text`` check; the evidence shows the claimed
ids against the job's, as text).
"""

from __future__ import annotations

from collections.abc import Callable

from dataplane.replay import StoredGroup

Encode = Callable[[str], list[int]]  # prompt text -> the job's prompt ids (dataplane.chat.prompt_ids)


def prompt_mismatches(groups: list[StoredGroup], encode: Encode) -> dict[str, tuple[str, str]]:
    """The groups whose prompt ids are not ``encode(prompt)``, by entry id: (their prompt ids, the job's), each as
    text (``"1 6 4"``: a BOS or a template marker differs where decoded text would not). A group's records share
    one prompt and its ids (dataplane/packed.py checks it), so its first is checked."""
    out: dict[str, tuple[str, str]] = {}
    known: dict[str, list[int]] = {}
    for stored in groups:
        packed = stored.packed
        if packed is None or not len(packed):
            continue
        prompt, length = packed.prompts[0], packed.prompt_lens[0]
        claimed = packed.tokens[:length].tolist()
        if prompt not in known:
            known[prompt] = encode(prompt)
        if claimed != known[prompt]:
            out[stored.entry_id] = (" ".join(map(str, claimed)), " ".join(map(str, known[prompt])))
    return out
