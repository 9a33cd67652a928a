"""The floor of the service benchmark: a bare ASGI app (no framework, no auth, no work).

Served by the same uvicorn (same loop and HTTP parser: uvloop + httptools when installed, same
flags) as the real service, it answers any request with a tiny JSON body after reading the
request body — what no route can beat on this server stack. ``bench_service.py`` reports every
route's batch-1 latency as a multiple of it.
"""


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        msg = await receive()
        more = msg.get("more_body", False)
    body = b'{"ok":true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
