"""The HTTP layer: Starlette handlers (JSON, SSE, WebSocket, pages) over the services and the store."""
