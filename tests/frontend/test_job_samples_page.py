"""The job page's samples: the newest the learner reported, newest step first, texts escaped, filtered by reward; a
bad bound is said on the page and not applied."""

from __future__ import annotations

import re

import pytest

from marketplace.services.samples import samples_record

from ..marketplace import factories
from .test_pages import signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def sample_rows(page: str) -> list[tuple[str, str]]:
    """(reward, completion) of each row of the samples table."""
    body = page.split('id="samples-table"')[1].split("</table>")[0]
    return re.findall(r'class="reward">([^<]*)</td>\s*<td><pre class="sample">[^<]*</pre></td><td><pre '
                      r'class="sample">([^<]*)</pre>', body)


def test_job_page_shows_the_samples_and_filters_them_by_reward() -> None:
    owner = factories.user()
    job = factories.job(owner)
    client = signed_in(owner)
    assert "None yet: the learner reports a few" in client.get(f"/jobs/{job.pk}/").content.decode()
    samples_record(job=job, step=10, rows=[{"version": 9, "worker": 999_999_999, "reward": 1.0, "prompt": "3+4?",
                                            "completion": "<b>7</b>"},
                                           {"version": 9, "worker": 999_999_999, "reward": 0.0, "prompt": "2+2?",
                                            "completion": "five"}])
    rig, _ = factories.worker(factories.user(), name="rig-samples")
    samples_record(job=job, step=20, rows=[{"version": 19, "worker": rig.pk, "reward": 0.5, "prompt": "9-1?",
                                            "completion": "8"}])

    shown = client.get(f"/jobs/{job.pk}/").content.decode()
    assert sample_rows(shown) == [("0.500", "8"), ("1.000", "&lt;b&gt;7&lt;/b&gt;"), ("0.000", "five")]
    # the worker by its name, as the workers table shows it (the learner reports its id); a gone one as unknown
    assert re.findall(r'<td class="worker" title="worker id \d+">([^<]*)</td>', shown) == [
        "rig-samples", "unknown", "unknown"]
    assert sample_rows(client.get(f"/jobs/{job.pk}/?min_reward=0.75").content.decode()) == [
        ("1.000", "&lt;b&gt;7&lt;/b&gt;")]
    page = client.get(f"/jobs/{job.pk}/?min_reward=0.2&max_reward=0.6").content.decode()
    assert sample_rows(page) == [("0.500", "8")] and 'name="min_reward" value="0.2"' in page
    assert "None in this reward range" in client.get(f"/jobs/{job.pk}/?min_reward=2").content.decode()
    page = client.get(f"/jobs/{job.pk}/?min_reward=1&max_reward=0").content.decode()
    assert "min_reward: 1.0 is above max_reward 0.0" in page and len(sample_rows(page)) == 3
