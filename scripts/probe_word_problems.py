"""How often a model answers the ``word_problems`` task's held-out problems, by template, before any training.

Use it to choose a job's decoding settings (temperature, ``max_new_tokens``, the system prompt) before spending an
hour on a run: a GRPO group learns only when some of its n answers are right and some wrong, so the sampled pass
rate at the job's temperature says how many groups will carry a signal. It scores as the task does
(:func:`dataplane.tasks.word_problems.final_number`, the number after the first ``####``) through the model's chat
template, and counts answers that write the system prompt's own example (``#### 42``; a few answers are 42).

    .venv/bin/python scripts/probe_word_problems.py var/models/smollm2-135m-instruct --problems 96
    .venv/bin/python scripts/probe_word_problems.py var/models/smollm2-135m-instruct --problems 32 \\
        --temperature 0.7 --samples 4
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataplane.tasks.word_problems import SYSTEM_PROMPT, final_number, generate_named  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="A Hugging Face model directory with a chat template.")
    parser.add_argument("--problems", type=int, default=96, help="The held-out split's first N problems.")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the job's evaluation).")
    parser.add_argument("--samples", type=int, default=1, help="Answers per problem (sampled only).")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--system-prompt", default=SYSTEM_PROMPT)
    parser.add_argument("--seed", type=int, default=0, help="The task's seed (its default 0).")
    parser.add_argument("--size", type=int, default=2000)
    parser.add_argument("--test-size", type=int, default=200)
    args = parser.parse_args(argv)
    if not (args.model_dir / "config.json").is_file():
        print(f"probe_word_problems: {args.model_dir} is not a Hugging Face model directory (no config.json)",
              file=sys.stderr)
        return 1
    if args.temperature <= 0 and args.samples != 1:
        print("probe_word_problems: greedy decoding gives one answer per problem: --samples 1", file=sys.stderr)
        return 1

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    problems = generate_named(args.seed, args.size)[:min(args.problems, args.test_size)]
    right: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    hashes = copies = 0
    started = time.monotonic()
    sampled = args.temperature > 0
    for first in range(0, len(problems), 16):
        chunk = problems[first:first + 16]
        texts = [tokenizer.apply_chat_template([{"role": "system", "content": args.system_prompt},
                                                {"role": "user", "content": problem}],
                                               tokenize=False, add_generation_prompt=True) for _, problem, _ in chunk]
        encoded = tokenizer(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**encoded, max_new_tokens=args.max_new_tokens, do_sample=sampled,
                                 temperature=args.temperature if sampled else None, top_p=None, top_k=None,
                                 num_return_sequences=args.samples, pad_token_id=tokenizer.pad_token_id)
        for row, ids in enumerate(out):
            template, _, answer = chunk[row // args.samples]
            text = tokenizer.decode(ids[encoded["input_ids"].shape[1]:], skip_special_tokens=True)
            right[template][1] += 1
            right[template][0] += int(final_number(text) == str(answer))
            hashes += "####" in text
            copies += "#### 42" in text
        print(f"  {first + len(chunk)}/{len(problems)} problems, {time.monotonic() - started:.0f} s", file=sys.stderr)
    total, answers = sum(r for r, _ in right.values()), sum(n for _, n in right.values())
    decoding = f"temperature {args.temperature}, {args.samples} per problem" if sampled else "greedy"
    print(f"{decoding}, {args.max_new_tokens} tokens: {total} of {answers} right ({total / answers:.3f}); "
          f"wrote #### in {hashes}; wrote the example's #### 42 in {copies}; {time.monotonic() - started:.0f} s")
    for template, (r, n) in sorted(right.items()):
        print(f"  {template:10s} {r}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
