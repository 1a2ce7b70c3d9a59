"""The learner's site client: its step reports carry the job's learner credential, made from the transfer secret
its announcement got, which the site requires before it takes audits of workers (docs/trust.md "Audits of work")."""

from __future__ import annotations

import httpx

from dataplane import credentials
from learner.client import SiteClient


def test_reports_carry_the_learner_credential_once_announced():
    seen: list[httpx.Request] = []

    def site(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/learner/"):
            return httpx.Response(200, json={"id": 7, "transfer_secret": "ab" * 32})
        return httpx.Response(201, json={})

    client = SiteClient("http://site", "e2u_owner")
    client.http = httpx.Client(base_url="http://site/api/", transport=httpx.MockTransport(site),
                               headers=client.http.headers)
    client.report(7, {"step": 1})  # before the announcement: no credential to show
    client.announce(7, t_train=None)
    client.report(7, {"step": 2})
    before, _, after = seen
    assert credentials.LEARNER_HEADER not in before.headers
    assert after.headers[credentials.LEARNER_HEADER] == credentials.learner_token("ab" * 32, job_id=7)
    assert after.headers["Authorization"] == "Token e2u_owner"
    credentials.verify_learner("ab" * 32, after.headers[credentials.LEARNER_HEADER], job_id=7)
