"""The learner's HTTP client for the site: read the job, report metrics and snapshots, finish."""

from __future__ import annotations

import time
from typing import Any

import httpx


class SiteError(RuntimeError):
    """The site refused a request (4xx): ``str(err)`` carries its reason."""


class SiteClient:
    def __init__(self, server: str, token: str, *, timeout: float = 15.0, retries: int = 5) -> None:
        self.http = httpx.Client(base_url=server.rstrip("/") + "/api/", timeout=timeout,
                                 headers={"Authorization": f"Token {token}"})
        self.retries = retries

    def _request(self, method: str, path: str, **kwargs) -> Any:
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as err:
                if attempt == self.retries:
                    raise SiteError(f"{method} {path}: site unreachable ({err})") from None
            else:
                if response.status_code < 400:
                    return response.json() if response.content else None
                if response.status_code < 500:
                    try:
                        reason = response.json().get("detail", response.text)
                    except ValueError:
                        reason = response.text
                    raise SiteError(f"{method} {path}: {response.status_code} {reason}")
                if attempt == self.retries:
                    raise SiteError(f"{method} {path}: {response.status_code} from the site")
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
        raise AssertionError("unreachable")

    def job(self, job_id: int) -> dict:
        return self._request("GET", f"jobs/{job_id}/")

    def announce(self, job_id: int, *, t_train: float | None, relay_address: str | None = None) -> dict:
        """Tell the site the learner is up; the reply is the job and its ``transfer_secret`` (docs/trust.md)."""
        body: dict[str, Any] = {"t_train": t_train}
        if relay_address is not None:
            body["relay_address"] = relay_address
        return self._request("POST", f"jobs/{job_id}/learner/", json=body)

    def report(self, job_id: int, metrics: dict) -> dict:
        return self._request("POST", f"jobs/{job_id}/metrics/", json=metrics)

    def publish(self, job_id: int, *, version: int, url: str, manifest: dict) -> dict:
        return self._request("POST", f"jobs/{job_id}/snapshots/", json={"version": version, "url": url,
                                                                         "manifest": manifest})

    def finish(self, job_id: int, *, status: str, reason: str = "") -> dict:
        return self._request("POST", f"jobs/{job_id}/finish/", json={"status": status, "reason": reason})

    def close(self) -> None:
        self.http.close()
