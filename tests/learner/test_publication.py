"""The learner's publication policy (learner/publication.py)."""

from __future__ import annotations

import pytest

from learner.publication import republish_on_resume


@pytest.mark.parametrize(("checkpoint", "published", "due"), [
    (4, 4, False), (4, 2, True),  # the checkpoint of a publication step, announced or not
    (5, 4, False), (5, 2, True), (5, 0, True),  # a checkpoint between two (--checkpoint-every): v4 was due
    (0, 0, False)])
def test_a_restarted_learner_publishes_when_the_site_lacks_the_last_publication_due(checkpoint, published, due):
    assert republish_on_resume(checkpoint, kappa=2, published_version=published) is due
