"""The site's seal on a stored group (dataplane/seal.py): it binds the job, the worker stamp, the lease and every
stored byte, under the site's key alone, and any of the keys given verifies it."""

from __future__ import annotations

import pytest

from dataplane.seal import seal, seal_key, seal_valid, sealed_bytes

KEY = seal_key("site secret", "echo2.test")
ENTRY = {"job_id": 7, "worker_id": 3, "lease_id": "1733-0", "data": b"E2G1" + bytes(range(256)) * 4}


def test_a_seal_verifies_under_its_key_and_any_of_several():
    stamp = seal(KEY, **ENTRY)
    assert len(stamp) == 64 and seal_valid([KEY], stamp, **ENTRY)
    assert seal_valid([seal_key("new secret", "echo2.test"), KEY], stamp.encode(), **ENTRY)  # a rotated key
    assert not seal_valid([seal_key("new secret", "echo2.test")], stamp, **ENTRY)


@pytest.mark.parametrize("change", [{"job_id": 8}, {"worker_id": 4}, {"lease_id": "1733-1"},
                                    {"data": ENTRY["data"][:-1] + b"\x01"}, {"data": ENTRY["data"] + b"\x00"}])
def test_any_field_changed_breaks_the_seal(change):
    assert not seal_valid([KEY], seal(KEY, **ENTRY), **{**ENTRY, **change})


def test_a_key_is_bound_to_its_secret_and_purpose():
    stamp = seal(KEY, **ENTRY)
    assert not seal_valid([seal_key("site secret", "echo2.other")], stamp, **ENTRY)
    assert not seal_valid([seal_key("site secret2", "echo2.test")], stamp, **ENTRY)


@pytest.mark.parametrize("claimed", [None, "", "00" * 32, "é" * 64, b"\xff" * 64])
def test_a_missing_or_made_up_seal_is_invalid_and_never_raises(claimed):
    assert not seal_valid([KEY], claimed, **ENTRY)


def test_the_fields_cannot_run_into_each_other():
    """Worker 12 of lease "3-0" and worker 1 of lease "23-0" give different bytes (a NUL between fields)."""
    a = sealed_bytes(job_id=1, worker_id=12, lease_id="3-0", data=b"x")
    b = sealed_bytes(job_id=1, worker_id=1, lease_id="23-0", data=b"x")
    assert a != b
