"""The browser side: pages, the websocket, the publisher of reply events, the chart."""
