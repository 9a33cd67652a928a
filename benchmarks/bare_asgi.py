"""The floor of the service benchmark: a bare ASGI app (no framework, no auth, no work).

Served by the same uvicorn (same loop and HTTP parser: uvloop + httptools when installed, same
flags) as the real service, it answers any request with a tiny JSON body after reading the
request body — what no route can beat on this server stack. ``bench_service.py`` reports every
route's batch-1 latency as a multiple of it. ``POST /echo`` answers the request body itself
(``application/octet-stream``): the floor of a binary transform, whose answer is as large as its
request — the cost of the server stack and of the client moving the bytes both ways, with no work.
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
    more, chunks = True, []
    while more:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        more = msg.get("more_body", False)
    echo = scope.get("path") == "/echo"
    body = b"".join(chunks) if echo else b'{"ok":true}'
    ctype = b"application/octet-stream" if echo else b"application/json"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
