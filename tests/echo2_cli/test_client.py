"""The owner CLI's pure parts: a refusal of the site on one line, and figures for people."""

from __future__ import annotations

import httpx
import pytest

from echo2_cli.client import reason_of
from echo2_cli.render import fmt, metric_line, summary_rows


@pytest.mark.parametrize(("status", "body", "reason"), [
    (400, {"detail": "staleness: too small", "errors": {"staleness": ["too small"]}}, "staleness: too small"),
    (400, {"detail": "a: x (and 2 more in errors)", "errors": {"a": ["x"], "loss.b": ["y", "z"]}},
     "a: x; loss.b: y; loss.b: z"),
    (401, {"detail": "Invalid token."}, "Invalid token."),
    (502, "<html>\n<h1>Bad gateway</h1></html>", "HTTP 502: <html> <h1>Bad gateway</h1></html>"),
])
def test_a_refusal_is_one_line_with_every_field_error(status: int, body, reason: str) -> None:
    response = httpx.Response(status, json=body) if isinstance(body, dict) else httpx.Response(status, text=body)
    assert reason_of(response) == reason


def test_unknown_figures_show_as_a_dash_and_steps_as_one_line() -> None:
    assert (fmt(None), fmt(0.25, 2, " s"), fmt(3)) == ("-", "0.25 s", "3")
    line = metric_line({"step": 7, "reward_mean": 0.5, "reward_std": 0.1, "loss": -0.02, "max_staleness": 2,
                        "dropped_stale": 0, "t_train": 1.5, "wait_s": 0.25})
    assert line == ("step      7  reward 0.5000 ± 0.1000  loss -0.0200  lag 2  dropped 0  train 1.500s  "
                    "wait 0.250s")
    rows = dict(summary_rows({"status": "running", "status_reason": "", "step": 3, "max_steps": 10,
                              "published_version": 1, "active_workers": 2, "bubble_ratio": None}, staleness=4))
    assert (rows["step"], rows["max staleness (S=4)"], rows["bubble (learner wait)"]) == ("3 / 10", "-", "-")
