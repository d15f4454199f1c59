"""Server-sent events: `data: <json>\\n\\n` frames on a chunked response.

A write to a client that has gone raises ClientGone, which the handler turns
into a cancelled generation (its pages are freed at once).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import web


class ClientGone(Exception):
    pass


@dataclass(frozen=True)
class Named:
    """An event with a name (OpenAI's Responses API, Anthropic's Messages API)."""
    event: str
    data: dict


class EventStream:
    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.resp = web.StreamResponse(headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",        # proxies must not buffer a stream
        })
        self.started = False

    async def start(self) -> None:
        if not self.started:
            self.started = True
            await self.resp.prepare(self.request)

    async def send(self, obj: dict | str | Named) -> None:
        head = ""
        if isinstance(obj, Named):
            head, obj = f"event: {obj.event}\n", obj.data
        data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False,
                                                           separators=(",", ":"))
        await self._write(f"{head}data: {data}\n\n".encode())

    async def done(self) -> None:
        """OpenAI's end-of-stream marker."""
        await self._write(b"data: [DONE]\n\n")

    async def _write(self, frame: bytes) -> None:
        await self.start()
        transport = self.request.transport
        if transport is None or transport.is_closing():
            raise ClientGone()
        try:
            await self.resp.write(frame)
        except (ConnectionError, RuntimeError) as e:
            raise ClientGone() from e

    async def finish(self) -> web.StreamResponse:
        try:
            await self.resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return self.resp
