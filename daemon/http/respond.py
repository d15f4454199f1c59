"""Answering with a generation: one JSON body, or a stream of server-sent events.

Each endpoint supplies a ReplyFormat that turns events into its own JSON shapes;
`answer` owns the control flow shared by all of them: gather or stream, report
a failure, cancel the generation when the client leaves.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from ckptd.daemon.generation import Generation, Result, failure
from ckptd.daemon.http.common import json_response
from ckptd.daemon.http.sse import ClientGone, EventStream
from ckptd.daemon.request import Finished
from ckptd.model.sampling.decoding import TokenEvent


class ReplyFormat(Protocol):
    done_marker: bool                              # end streams with `data: [DONE]`

    def opening(self) -> dict | None: ...          # first stream chunk, before any token
    def chunk(self, ev: TokenEvent) -> dict | None: ...
    def closing(self, fin: Finished) -> dict | None: ...
    def usage(self, fin: Finished) -> dict | None: ...   # the include_usage chunk
    def body(self, res: Result) -> dict: ...       # the whole non-streaming answer


async def answer(request: web.Request, gen: Generation, fmt: ReplyFormat, stream: bool,
                 include_usage: bool = False) -> web.StreamResponse:
    try:
        if not stream:
            res = await gen.collect()
            err = failure(res.finished)
            if err is not None:
                raise err
            return json_response(fmt.body(res))
        sse = EventStream(request)
        try:
            first = fmt.opening()
            if first is not None:
                await sse.send(first)
            else:
                await sse.start()
            async for ev in gen.events():
                chunk = fmt.chunk(ev)
                if chunk is not None:
                    await sse.send(chunk)
            fin = gen.finished
            err = failure(fin)
            if err is not None:
                await sse.send(err.body())
            else:
                last = fmt.closing(fin)
                if last is not None:
                    await sse.send(last)
                if include_usage:
                    await sse.send(fmt.usage(fin))
            if fmt.done_marker:
                await sse.done()
        except ClientGone:
            gen.cancel()
        return await sse.finish()
    finally:
        gen.close()
