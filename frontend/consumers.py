"""Live job updates for the dashboard: a signed-in owner (or staff) joins the job's group.

Services announce that a job changed (``job.changed``, no payload). Each open page computes the live view
(``selectors.job_live``) itself: at once for the first change, then at most once per ``PUSH_INTERVAL_S``
however many changes arrive meanwhile (a snapshot brings one install report per worker), and always once
more after the last change, so the page ends on the current state. Learner steps are sent incrementally
(those after the last one this page has), so coalescing never drops a point from the charts.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from marketplace import services
from marketplace.models import Job
from marketplace.reads import selectors

PUSH_INTERVAL_S = 0.5


class JobLiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        allowed = user is not None and user.is_authenticated and await database_sync_to_async(
            lambda: selectors.jobs_visible_to(user).filter(pk=self.job_id).exists()
        )()
        if not allowed:
            await self.close(code=4403)
            return
        # The page says which learner step it was rendered with; later ones are sent as they come.
        since = (parse_qs(self.scope.get("query_string", b"").decode()).get("since") or ["0"])[0]
        self.since_step = int(since) if since.isascii() and since.isdigit() else 0  # '²'.isdigit() is True
        self.dirty = False
        self.flusher: asyncio.Task | None = None
        await self.channel_layer.group_add(services.job_group(self.job_id), self.channel_name)
        await self.accept()

    async def disconnect(self, code) -> None:
        if getattr(self, "flusher", None) is not None:
            self.flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.flusher
        await self.channel_layer.group_discard(services.job_group(self.job_id), self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        # Not parsed at all: whatever a browser sends (JSON nested 100 000 deep included) gets the same answer.
        await self.send_json({"type": "rejected", "reason": "this socket only sends updates"})

    async def job_changed(self, event) -> None:
        self.dirty = True
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self.dirty:
            self.dirty = False
            live = await database_sync_to_async(self._live)()
            if live is not None:
                await self.send_json({"type": "update", **live})
            await asyncio.sleep(PUSH_INTERVAL_S)

    def _live(self) -> dict | None:
        job = Job.objects.filter(pk=self.job_id).first()
        if job is None:
            return None
        live = selectors.job_live(job, since_step=self.since_step)
        if live["metrics"]:
            self.since_step = live["metrics"][-1]["step"]
        return live
