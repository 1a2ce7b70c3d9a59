"""Reward functions as RL users write them (docs/rewards.md): TRL's signature, weights, built-in scorers, and a user's
function that raises or returns nonsense costing one record its score, counted, never the caller."""

from __future__ import annotations

import sys
import textwrap
import threading

import pytest

from dataplane.records import MAX_REWARD
from dataplane.rewards import (
    CannotServe,
    RewardError,
    RewardStats,
    ScorerMissing,
    UserCodeRefused,
    build_reward,
    parse_reward_spec,
)

USER_MODULE = '''
import math

def length(completions, **kwargs):  # TRL's own examples name only what they use
    return [float(len(c)) for c in completions]

def picky(prompts, completions, answer, **kwargs):
    out = []
    for c, a in zip(completions, answer):
        if c == "boom":
            raise ValueError("cannot score " + c)
        out.append(1.0 if c == a else 0.0)
    return out

def nonsense(prompts, completions, **kwargs):
    table = {"nan": math.nan, "inf": math.inf, "huge": 1e300, "text": "1.0", "none": None}
    return [table.get(c, 0.5) for c in completions]

def wrong_length(prompts, completions, **kwargs):
    return [1.0]

def scaled(prompts, completions, scale=1.0, **kwargs):
    return [scale] * len(completions)

NOT_CALLABLE = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """An owner's reward module, importable as ``owner_rewards``."""
    (tmp_path / "owner_rewards.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "owner_rewards"
    sys.modules.pop("owner_rewards", None)


def test_a_spec_in_each_shorthand_normalizes_to_the_same_functions() -> None:
    full = {"functions": [{"function": "math_verify", "weight": 1.0, "options": {}, "fallback": 0.0,
                          "factory": None, "scored_on": None}]}
    assert parse_reward_spec("math_verify").model_dump() == full
    assert parse_reward_spec(["math_verify"]).model_dump() == full
    assert parse_reward_spec(full).model_dump() == full


@pytest.mark.parametrize(("spec", "message"), [
    ("nope", "reward.functions.0.function: 'nope' is neither a built-in scorer"),
    ([], "reward.functions: List should have at least 1 item"),
    ({"functions": [{"function": "regex", "weight": float("nan")}]}, "reward.functions.0.weight:"),
    ({"functions": [{"function": "regex", "weight": 1e9}]}, "reward.functions.0.weight: Input should be less"),
    ({"functions": [{"function": "regex", "colour": 1}]}, "reward.functions.0.colour: Extra inputs"),
    ({"functions": [{"function": "regex", "options": {"pattern": "("}}]},
     "reward.functions.0.options.pattern: not a regular expression"),
    ({"functions": [{"function": "regex"}]}, "reward.functions.0.options.pattern: must be a regular expression"),
    (["exact_match", {"function": "regex", "options": {"patern": "x"}}],
     "reward.functions.1.options: unknown option 'patern' of regex"),
    ({"functions": [{"function": "exact_match", "options": {"pattern": "<a>.*</a>"}}]},
     "reward.functions.0.options.pattern: must have a group"),
])
def test_a_bad_spec_is_refused_naming_the_field(spec, message) -> None:
    with pytest.raises(RewardError) as err:
        build_reward(spec, allow_user_code=True)
    assert str(err.value).startswith(message), str(err.value)


def test_math_verify_checks_latex_and_number_answers_against_the_answer_column() -> None:
    reward = build_reward("math_verify", allow_user_code=False)
    completions = ["So the answer is $\\boxed{\\frac{1}{2}}$.", "The answer is \\boxed{0.5}", "\\boxed{2}",
                   "x = \\boxed{\\sqrt{2}}", "I don't know", "\\boxed{3}"]
    answers = ["0.5", "\\frac12", "2", "$\\sqrt{2}$", "7", "4"]
    assert reward(["q"] * 6, completions, answer=answers) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_math_verify_runs_off_the_main_thread_where_its_alarm_cannot() -> None:
    """The agent scores in a worker thread (asyncio.to_thread): math-verify's SIGALRM timeout is not set there."""
    reward, out = build_reward("math_verify", allow_user_code=False), []
    thread = threading.Thread(target=lambda: out.append(reward(["q"], ["\\boxed{42}"], answer=["42"])))
    thread.start()
    thread.join()
    assert out == [[1.0]] and reward.stats.errors == 0


def test_math_verify_without_its_package_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # an import of it fails, as when not installed
    with pytest.raises(ScorerMissing, match=r"reward.functions.0: .*pip install 'echo2\[math\]'"):
        build_reward("math_verify", allow_user_code=False)


def test_exact_match_normalizes_and_can_extract_the_answer() -> None:
    plain = build_reward("exact_match", allow_user_code=False)
    assert plain(["q"] * 3, ["  Paris. ", "paris\n", "Lyon"], answer=["paris", "Paris", "Paris"]) == [1.0, 1.0, 0.0]
    tagged = build_reward([{"function": "exact_match", "options": {"pattern": "<answer>(.*?)</answer>",
                                                                   "column": "gold"}}], allow_user_code=False)
    assert tagged(["q"] * 3, ["think <answer>12</answer>", "<answer>1</answer><answer>13</answer>", "13"],
                  gold=["12", "13", "13"]) == [1.0, 1.0, 0.0]


def test_regex_searches_and_format_matches_the_whole_completion() -> None:
    pattern = "<think>.*?</think>\\s*<answer>.*?</answer>"
    found = build_reward([{"function": "regex", "options": {"pattern": pattern}}], allow_user_code=False)
    whole = build_reward([{"function": "format", "options": {"pattern": pattern}}], allow_user_code=False)
    completions = ["<think>a\nb</think> <answer>4</answer>", "ok <think>a</think><answer>4</answer> more", "4"]
    assert found(["q"] * 3, completions) == [1.0, 1.0, 0.0]
    assert whole(["q"] * 3, completions) == [1.0, 0.0, 0.0]


def test_weights_combine_two_functions_into_one_sum(user_module) -> None:
    reward = build_reward(["exact_match", {"function": "format", "weight": 0.25, "options": {"pattern": "\\d+"}},
                           {"function": f"{user_module}:scaled", "weight": -2.0, "options": {"scale": 0.5}}],
                          allow_user_code=True)
    assert reward(["q"] * 3, ["4", "five", "5"], answer=["4", "five", "4"]) == [0.25, 0.0, -0.75]
    assert parse_reward_spec(["exact_match", {"function": "format", "weight": 0.25}]).bounds() == (0.0, 1.25)


def test_user_code_is_refused_without_the_opt_in_and_never_imported(user_module) -> None:
    with pytest.raises(UserCodeRefused, match="--allow-user-code") as err:
        build_reward(["math_verify", f"{user_module}:length"], allow_user_code=False)
    assert isinstance(err.value, CannotServe)  # a worker refuses the job for it
    assert user_module not in sys.modules
    parse_reward_spec(f"{user_module}:length")  # the site checks the spec: nothing imported either
    assert user_module not in sys.modules


def test_user_code_runs_with_the_opt_in_with_the_dataset_columns_by_keyword_as_trl_passes_them(user_module) -> None:
    reward = build_reward(f"{user_module}:picky", allow_user_code=True)
    assert reward(["q", "q"], ["a", "b"], answer=["a", "a"]) == [1.0, 0.0]
    assert reward.stats == RewardStats(calls=1)
    short = build_reward(f"{user_module}:length", allow_user_code=True)  # def length(completions, **kwargs)
    assert short(["prompt", "prompt"], ["ab", "abcd"], answer=["x", "y"]) == [2.0, 4.0]


@pytest.mark.parametrize(("function", "message"), [
    ("no_such_module_here:fn", "reward.functions.0.function: cannot load 'no_such_module_here:fn' "
                               "(no_such_module_here: ModuleNotFoundError"),
    ("owner_rewards:missing", "reward.functions.0.function: cannot load 'owner_rewards:missing'"),
    ("owner_rewards:NOT_CALLABLE", "reward.functions.0.function: 'owner_rewards:NOT_CALLABLE' is not callable"),
])
def test_a_user_function_that_cannot_be_loaded_is_a_bad_spec(user_module, function, message) -> None:
    with pytest.raises(RewardError) as err:
        build_reward(function, allow_user_code=True)
    assert str(err.value).startswith(message), str(err.value)


def test_a_function_that_raises_costs_only_the_record_it_raised_on_counted(user_module) -> None:
    reward = build_reward([f"{user_module}:picky", {"function": "regex", "weight": 0.5, "options": {"pattern": "o"}}],
                          allow_user_code=True)
    scores = reward(["q"] * 3, ["a", "boom", "b"], answer=["a", "boom", "a"])
    assert scores == [1.0, 0.5, 0.0]  # "boom": picky's fallback 0, regex still adds its half
    stats = reward.stats
    assert stats.errors == 1 and stats.non_finite == 0
    assert stats.last_error == "owner_rewards:picky: ValueError: cannot score boom"
    assert stats.calls == 1 + 3 + 1  # the batch, then record by record to find the culprit; regex once
    assert reward(["q"], ["a"], answer=["a"]) == [1.0]  # it goes on
    assert reward.stats.minus(stats) == RewardStats(calls=2)


def test_a_declared_fallback_scores_the_record_a_function_failed(user_module) -> None:
    reward = build_reward({"functions": [{"function": f"{user_module}:picky", "fallback": -1.0}]},
                          allow_user_code=True)
    assert reward(["q", "q"], ["boom", "a"], answer=["x", "a"]) == [-1.0, 1.0]


def test_non_finite_and_non_numbers_fall_back_and_are_counted_none_adds_nothing(user_module) -> None:
    reward = build_reward(f"{user_module}:nonsense", allow_user_code=True)
    scores = reward(["q"] * 6, ["nan", "inf", "huge", "text", "none", "fine"])
    assert scores == [0.0, 0.0, 0.0, 0.0, 0.0, 0.5]
    assert all(abs(s) <= MAX_REWARD for s in scores)
    assert reward.stats.non_finite == 4 and reward.stats.errors == 0  # None: TRL's "does not apply"
    assert reward.stats.last_error.startswith("owner_rewards:nonsense: returned")


def test_a_function_returning_the_wrong_number_of_scores_is_an_error_per_record(user_module) -> None:
    reward = build_reward(f"{user_module}:wrong_length", allow_user_code=True)
    assert reward(["q"] * 3, ["a", "b", "c"]) == [1.0, 1.0, 1.0]  # alone, each record gets its one score
    reward2 = build_reward(f"{user_module}:picky", allow_user_code=True)
    assert reward2(["q"], ["a"]) == [0.0]  # no answer column: picky raises TypeError, counted
    assert reward2.stats.errors == 1 and "TypeError" in reward2.stats.last_error


def test_error_text_is_one_bounded_line_without_nul(user_module, tmp_path) -> None:
    source = "def fn(prompts, completions, **k):\n    raise RuntimeError('x\\x00' * 500 + '\\nmore')\n"
    (tmp_path / "loud_rewards.py").write_text(source)
    try:
        reward = build_reward("loud_rewards:fn", allow_user_code=True)
        assert reward(["q"], ["a"]) == [0.0]
    finally:
        sys.modules.pop("loud_rewards", None)
    last = reward.stats.last_error
    assert len(last) <= 200 and "\x00" not in last and "\n" not in last and last.endswith("...")
