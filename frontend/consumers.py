"""Live job updates for the dashboard: a signed-in owner (or staff) joins the job's group."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from marketplace import selectors, services


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
        await self.channel_layer.group_add(services.job_group(self.job_id), self.channel_name)
        await self.accept()

    async def disconnect(self, code) -> None:
        await self.channel_layer.group_discard(services.job_group(self.job_id), self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        await self.send_json({"type": "rejected", "reason": "this socket only sends updates"})

    async def job_update(self, event) -> None:
        await self.send_json({"type": "update", **event["live"]})
