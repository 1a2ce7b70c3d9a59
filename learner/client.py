"""The learner's HTTP client for the site: read the job, report metrics and snapshots, finish."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx

from dataplane import credentials

log = logging.getLogger("echo2.learner")


class SiteError(RuntimeError):
    """The site refused a request (4xx): ``str(err)`` carries its reason."""


class SiteUnreachable(SiteError):
    """The site did not answer (connection refused, timeouts, 5xx) after the retries: an outage, not a refusal."""


def _retry_after(response: httpx.Response, *, default: float) -> float:
    """The seconds a 429's Retry-After asks for (at most a minute), else ``default``."""
    try:
        return min(max(float(response.headers.get("Retry-After", default)), 0.0), 60.0)
    except ValueError:
        return default


class SiteClient:
    def __init__(self, server: str, token: str, *, timeout: float = 15.0, retries: int = 5) -> None:
        self.http = httpx.Client(base_url=server.rstrip("/") + "/api/", timeout=timeout,
                                 headers={"Authorization": f"Token {token}"})
        self.retries = retries
        self.learner_credential: dict[int, str] = {}  # job id -> its learner credential, from the announce reply

    def _request(self, method: str, path: str, *, retries: int | None = None, **kwargs) -> Any:
        """One request, retried (``retries``, default the client's) with backoff through outages.
        Raises :class:`SiteError` for a refusal, :class:`SiteUnreachable` when the site never answered."""
        delay = 0.5
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as err:
                if attempt == retries:
                    raise SiteUnreachable(f"{method} {path}: site unreachable ({err})") from None
            else:
                if response.status_code < 400:
                    return response.json() if response.content else None
                if response.status_code == 429 and attempt < retries:  # throttled: wait as long as the site says
                    time.sleep(_retry_after(response, default=delay))
                    delay = min(delay * 2, 8.0)
                    continue
                if response.status_code < 500:
                    try:
                        reason = response.json().get("detail", response.text)
                    except ValueError:
                        reason = response.text
                    raise SiteError(f"{method} {path}: {response.status_code} {reason}")
                if attempt == retries:
                    raise SiteUnreachable(f"{method} {path}: {response.status_code} from the site")
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
        raise AssertionError("unreachable")

    def job(self, job_id: int) -> dict:
        return self._request("GET", f"jobs/{job_id}/")

    def announce(self, job_id: int, *, t_train: float | None, relay_address: str | None = None,
                 vocab_size: int | None = None, retries: int | None = None) -> dict:
        """Tell the site the learner is up; the reply is the job and its ``transfer_secret`` (docs/trust.md).
        ``vocab_size``: the model's embedding rows, which the site checks returned token ids against."""
        body: dict[str, Any] = {"t_train": t_train}
        if relay_address is not None:
            body["relay_address"] = relay_address
        if vocab_size is not None:
            body["vocab_size"] = vocab_size
        reply = self._request("POST", f"jobs/{job_id}/learner/", json=body, retries=retries)
        secret = (reply or {}).get("transfer_secret") if isinstance(reply, dict) else None
        if secret:
            self.learner_credential[job_id] = credentials.learner_token(secret, job_id=job_id)
        return reply

    def streams(self, job_id: int) -> dict:
        """The learner's door to the job's streams (``url``, ``username``, ``isolated``, ``reason``): a fresh password
        at each call, which cuts off any earlier learner of the job (docs/trust.md "The learner's door")."""
        return self._request("POST", f"jobs/{job_id}/learner/streams/")

    def report(self, job_id: int, metrics: dict, *, retries: int | None = None) -> dict:
        """A step's report; it carries the job's learner credential (learned from the announcement), without
        which the site takes no audits of workers (docs/trust.md "Audits of work")."""
        token = self.learner_credential.get(job_id)
        headers = {credentials.LEARNER_HEADER: token} if token else None
        return self._request("POST", f"jobs/{job_id}/metrics/", json=metrics, retries=retries, headers=headers)

    def publish(self, job_id: int, *, version: int, url: str, manifest: dict, retries: int | None = None) -> dict:
        return self._request("POST", f"jobs/{job_id}/snapshots/", json={"version": version, "url": url,
                                                                         "manifest": manifest}, retries=retries)

    def pause(self, job_id: int, *, reason: str) -> dict:
        """Pause the job (its workers released, queued records still trained) with ``reason`` as its status."""
        return self._request("POST", f"jobs/{job_id}/pause/", json={"reason": reason})

    def finish(self, job_id: int, *, status: str, reason: str = "") -> dict:
        return self._request("POST", f"jobs/{job_id}/finish/", json={"status": status, "reason": reason})

    def close(self) -> None:
        self.http.close()


class Heartbeat:
    """Tells the site every ``interval_s`` that the learner is alive, from a thread of its own, so a long
    step or a long wait for data never looks like a dead learner (the site stalls a job whose learner is
    silent and releases its workers). Its own HTTP client; a beat the site does not take is just missed."""

    def __init__(self, server: str, token: str, job_id: int, *, interval_s: float, timeout: float) -> None:
        self.client = SiteClient(server, token, timeout=min(timeout, interval_s), retries=0)
        self.job_id, self.interval_s = job_id, interval_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="learner-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                self.client.announce(self.job_id, t_train=None)
            except SiteError as err:
                log.debug("job %s: heartbeat not taken: %s", self.job_id, err)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(self.interval_s + 1)
        self.client.close()
