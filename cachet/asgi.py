"""ASGI entry point: HTTP through Django behind the request body limits; websockets through Channels behind the
exact origin check, the allowed hosts check and the session login."""

from __future__ import annotations

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from cachet.body_limits import BodyLimit  # noqa: E402
from cachet.origins import ExactOriginValidator  # noqa: E402
from cachet.outage import WebsocketDatabaseGuard  # noqa: E402
from chat.web.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodyLimit(django_asgi_app),
        "websocket": WebsocketDatabaseGuard(
            ExactOriginValidator(AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))))
        ),
    }
)

# What serving needs is built and lives as long as the process: the cycle collector stops walking it. A full
# collection walked some 100,000 objects of Django and the app (40-80 ms on 2 cores, every piece of every
# reply waiting meanwhile); now it walks what was made since.
gc.collect()
gc.freeze()
