"""Policy-loss variants (docs/learner.md): the pieces they share live in :mod:`.base`."""
