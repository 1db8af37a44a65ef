"""Another process on the layer: ``python -m tests.cachet.pg_layer_peer DATABASE_NAME``.

It joins the group ``peer-in`` and prints ``ready`` and its own channel; each ``echo`` it receives (through
the group or sent to its channel) it sends back to ``reply_to`` and to the group ``test-out``; ``bye`` ends it.
"""

from __future__ import annotations

import asyncio
import os
import sys


async def serve(database: str) -> None:
    from django.db import connections

    from cachet.pg_layer import PostgresChannelLayer

    connections.settings["default"]["NAME"] = database
    layer = PostgresChannelLayer(capacity=100)
    mine = await layer.new_channel()
    await layer.group_add("peer-in", mine)
    print("ready", mine, flush=True)
    while True:
        message = await layer.receive(mine)
        if message["type"] == "bye":
            break
        if message["type"] == "echo":
            await layer.send(message["reply_to"], {"type": "echoed", "text": message["text"]})
            await layer.group_send("test-out", {"type": "fanned", "text": message["text"]})
    await layer.close()


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    import django

    django.setup()
    asyncio.run(serve(sys.argv[1]))


if __name__ == "__main__":
    main()
