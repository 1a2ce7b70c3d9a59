"""Transfer credentials: a token admits exactly the worker, job and versions it was issued for, until it expires;
any tampering, another secret, or a token the site did not issue to that child is refused with the reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataplane.credentials import CredentialError, Grant, fingerprint, issue, new_secret, parse, verify, verify_issued

SECRET = "s3cret-of-job-7"
NOW = 1_700_000_000.0


def token(**fields) -> str:
    args = {"job_id": 7, "worker_id": 3, "lowest": 4, "highest": 4, "expires": int(NOW) + 600} | fields
    return issue(SECRET, **args)


def test_a_valid_credential_grants_its_worker_the_versions_it_covers() -> None:
    grant = verify(SECRET, token(lowest=2, highest=5), job_id=7, version=5, now=NOW, worker_id=3)
    assert grant == Grant(job_id=7, worker_id=3, lowest=2, highest=5, expires=int(NOW) + 600)
    assert verify(SECRET, token(), job_id=7, version=4, now=NOW).worker_id == 3


@pytest.mark.parametrize(("presented", "scope", "reason"), [
    (None, {}, "no credential"),
    ("", {}, "no credential"),
    ("Bearer nonsense", {}, "malformed credential"),
    (token().replace("e2t1", "e2t2"), {}, "malformed credential"),
    (token()[:-1], {}, "malformed credential"),
    (token() + "0", {}, "malformed credential"),
    (issue("another job's secret", job_id=7, worker_id=3, lowest=4, highest=4, expires=int(NOW) + 600), {},
     "bad credential signature"),
    (token(job_id=8), {}, "credential for job 8, not job 7"),
    (token(), {"version": 5}, "credential covers versions 4..4, not 5"),
    (token(expires=int(NOW) - 30), {}, "credential expired 30 s ago"),
    (token(expires=int(NOW)), {}, "credential expired 0 s ago"),
    (token(worker_id=9), {"worker_id": 3}, "credential of worker 9, not of worker 3"),
])
def test_each_way_a_credential_can_be_wrong_is_named(presented, scope, reason) -> None:
    with pytest.raises(CredentialError) as err:
        verify(SECRET, presented, **({"job_id": 7, "version": 4, "now": NOW} | scope))
    assert str(err.value) == reason


def test_nothing_is_admitted_before_the_secret_is_known() -> None:
    with pytest.raises(CredentialError, match="does not hold the job's transfer secret"):
        verify(None, token(), job_id=7, version=4, now=NOW)


_FIELDS = st.fixed_dictionaries({"job_id": st.integers(1, 10**6), "worker_id": st.integers(1, 10**6),
                                 "lowest": st.integers(0, 1000), "span": st.integers(0, 5),
                                 "expires": st.integers(int(NOW) + 1, int(NOW) + 10**6)})


@given(fields=_FIELDS, position=st.integers(0, 10**6), replacement=st.sampled_from("0123456789abcdef.x"))
def test_any_one_character_changed_is_refused(fields, position, replacement) -> None:
    good = issue(SECRET, job_id=fields["job_id"], worker_id=fields["worker_id"], lowest=fields["lowest"],
                 highest=fields["lowest"] + fields["span"], expires=fields["expires"])
    i = position % len(good)
    tampered = good[:i] + replacement + good[i + 1:]
    if tampered == good:
        return
    with pytest.raises(CredentialError):
        verify(SECRET, tampered, job_id=fields["job_id"], version=fields["lowest"], now=NOW,
               worker_id=fields["worker_id"])


@given(fields=_FIELDS, secret=st.text(min_size=1, max_size=40))
def test_a_token_round_trips_and_claims_what_was_issued(fields, secret) -> None:
    highest = fields["lowest"] + fields["span"]
    made = issue(secret, job_id=fields["job_id"], worker_id=fields["worker_id"], lowest=fields["lowest"],
                 highest=highest, expires=fields["expires"])
    assert len(made) <= 200
    claimed, _, _ = parse(made)
    assert claimed == Grant(fields["job_id"], fields["worker_id"], fields["lowest"], highest, fields["expires"])
    for version in (fields["lowest"], highest):
        assert verify(secret, made, job_id=fields["job_id"], version=version, now=NOW) == claimed
    with pytest.raises(CredentialError, match="not"):
        verify(secret, made, job_id=fields["job_id"], version=highest + 1, now=NOW)


def test_issuing_is_deterministic_and_secrets_are_fresh() -> None:
    assert token() == token()  # the parent's fingerprint and the child's token come from separate calls
    assert new_secret() != new_secret() and len(new_secret()) >= 40


def test_a_relay_admits_only_the_token_the_site_issued_to_that_child() -> None:
    mine = token()
    prints = [fingerprint(token(worker_id=8)), fingerprint(mine)]
    assert verify_issued(mine, prints, job_id=7, version=4, worker_id=3, now=NOW).worker_id == 3
    cases = [
        (None, prints, 3, "no credential"),
        (token(expires=int(NOW) + 601), prints, 3, "credential is not the one the site issued to worker 3"),
        (token(worker_id=8), [fingerprint(token(worker_id=8))], 3, "credential of worker 8, not of worker 3"),
        (mine, [], 3, "credential is not the one the site issued to worker 3"),
        (token(expires=int(NOW) - 1), [fingerprint(token(expires=int(NOW) - 1))], 3, "credential expired 1 s ago"),
        (token(job_id=9), [fingerprint(token(job_id=9))], 3, "credential for job 9, not job 7"),
    ]
    for presented, known, worker, reason in cases:
        with pytest.raises(CredentialError) as err:
            verify_issued(presented, known, job_id=7, version=4, worker_id=worker, now=NOW)
        assert str(err.value) == reason
