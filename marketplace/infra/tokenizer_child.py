"""The site's decoding of text failures, in a process of its own (started by ``infra/job_tokenizer.py``): load the
job's tokenizer from a folder of version 0's files and give the verdict on each failure
(``marketplace.core.audit_checks.decoded_verdict``).

``python -P -m marketplace.infra.tokenizer_child FOLDER`` reads ``{"prompt_format": ..., "items": [...]}`` (each item
``audit_checks.text_item``) as JSON on stdin and writes one JSON line on stdout: ``{"verdicts": [[site, why],
...]}``, or ``{"error": why}`` when the tokenizer does not load. Its own process because the files are the job
owner's: whatever they cost (a pre-tokenizer's regex that backtracks, a chat template that loops, memory) ends with
the parent's timeout, and the process holds nothing of the site (its environment is cleared: no database, no
secret). No code of the files runs: ``trust_remote_code=False`` and no ``.py`` file is in the folder.
"""

from __future__ import annotations

import json
import os
import sys

from dataplane.chat import as_prompt_format, prompt_ids

from ..core.audit_checks import CONSISTENT, SiteCheck, decoded_verdict


def main() -> int:
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # whatever a library prints is not the answer
    request = json.loads(sys.stdin.read())
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=False, local_files_only=True)
        fmt = as_prompt_format(request.get("prompt_format"))
    except Exception as err:  # noqa: BLE001 - any failure to load is the one answer: no tokenizer
        return _answer(out, {"error": f"the job's tokenizer does not load ({type(err).__name__}: {str(err)[:200]})"})

    def decode(runs: list[list[int]]) -> list[str]:
        return tokenizer.batch_decode(runs, skip_special_tokens=True)  # as the engines decode (worker_agent/engines)

    def encode(prompt: str) -> list[int]:
        return prompt_ids(tokenizer, prompt, fmt)

    verdicts = []
    for item in request["items"]:
        try:
            verdict = decoded_verdict(item, decode=decode, encode=encode)
        except Exception as err:  # noqa: BLE001 - one record the tokenizer cannot take is that record's verdict
            verdict = SiteCheck(CONSISTENT, f"the site's decoding failed ({type(err).__name__}: {str(err)[:160]})")
        verdicts.append([verdict.status, verdict.why[:300]])
    return _answer(out, {"verdicts": verdicts})


def _answer(out, answer: dict) -> int:  # noqa: ANN001 - a text file
    out.write(json.dumps(answer) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
