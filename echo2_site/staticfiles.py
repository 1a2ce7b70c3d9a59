"""Static files under daphne: Django's ``ASGIStaticFilesHandler``, with a path that climbs out of a static folder
(``/static/%2e%2e/...``) answered 400 like any suspicious request (Django's own ``response_for_exception``), not
the unhandled ``SuspiciousFileOperation`` that dropped the connection with a 500."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousOperation
from django.core.handlers.exception import response_for_exception


class StaticFilesHandler(ASGIStaticFilesHandler):
    async def get_response_async(self, request):
        try:
            return await super().get_response_async(request)
        except SuspiciousOperation as err:
            return await sync_to_async(response_for_exception, thread_sensitive=False)(request, err)
