"""ASGI entry point: HTTP goes to Django, websockets to Channels (agents and dashboards)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "echo2_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from echo2_site.gate import Gate  # noqa: E402
from echo2_site.staticfiles import StaticFilesHandler  # noqa: E402
from frontend import dist  # noqa: E402
from frontend.consumers import JobLiveConsumer  # noqa: E402
from marketplace.infra import learner_door  # noqa: E402
from marketplace.realtime.consumers import AgentConsumer  # noqa: E402

websocket_urlpatterns = [
    path("ws/agent/", AgentConsumer.as_asgi()),
    # Dashboards are browsers: check the Origin and use the session login.
    path("ws/jobs/<int:job_id>/", AllowedHostsOriginValidator(AuthMiddlewareStack(JobLiveConsumer.as_asgi()))),
]

dist.log_startup()  # which agent wheel providers get, or why none
learner_door.log_startup()  # whether each learner gets a Redis user of its own, or why not

application = ProtocolTypeRouter(
    {
        # Sign-in floods and oversized uploads are refused before Django reads a body or takes a connection.
        "http": Gate(StaticFilesHandler(django_asgi_app)),
        # Agents are not browsers: they authenticate with their worker key (see AgentConsumer).
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
