"""Answering with generations: one JSON body, or a stream of server-sent events.

A request may run several generations (a batch of prompts, `n` choices); each
endpoint supplies a ReplyFormat that turns their events into its own JSON shapes,
generation i as choice (or result) i. `answer` owns the control flow shared by all:
gather or stream (interleaved as tokens come), report a failure, cancel every
generation when the client leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Protocol

from aiohttp import web

from ckptd.daemon.generation import Generation, Result, failure
from ckptd.daemon.http.common import blocking, json_response
from ckptd.daemon.http.errors import ApiError
from ckptd.daemon.http.schemas import Generate
from ckptd.daemon.http.sse import ClientGone, EventStream, Named
from ckptd.daemon.request import Finished, Progress, Stats
from ckptd.daemon.service import Service
from ckptd.model.sampling.decoding import TokenEvent


class ReplyFormat(Protocol):
    """Each stream hook returns what to send: one event, several, or None."""
    done_marker: bool                              # end streams with `data: [DONE]`
    timings: list[Stats] | None                    # set with timings_per_token: live stats

    def opening(self, i: int) -> dict | None: ...  # first chunk of generation i
    def chunk(self, i: int, ev: TokenEvent) -> dict | None: ...
    def progress(self, i: int, ev: Progress) -> dict | None: ...
    def closing(self, i: int, fin: Finished) -> dict | None: ...
    def usage(self, fins: list[Finished]) -> dict | None: ...   # the include_usage chunk
    def error(self, err: ApiError) -> dict | Named: ...         # a failure mid-stream
    def body(self, results: list[Result]) -> dict | list: ...   # the whole answer


def prompt_progress(ev: Progress) -> dict:
    return {"total": ev.total, "cache": ev.cache, "processed": ev.processed,
            "time_ms": round(ev.time_ms, 3)}


async def run(request: web.Request, svc: Service, prompts: list[list[int]], salt: str | None,
              g: Generate, make_format, prompt_param: str = "prompt") -> web.StreamResponse:
    """Check, compile and submit one request's generations (each prompt `g.n` times),
    then answer with the format `make_format(jobs)` builds."""
    params = await blocking(svc.constrain, g.params, g)     # compiled once, cached
    jobs = []
    for tokens in prompts:
        p = svc.fit_to_context(tokens, g.max_tokens, params, prompt_param)
        # copies of a prompt draw differently: choice j seeds with seed + j
        jobs += [(tokens, replace(p, seed=(p.seed + j) % 2**32) if j else p)
                 for j in range(g.n)]
    gens = svc.generations(jobs, salt, g)
    fmt = make_format(jobs)
    fmt.timings = [gen.req.stats for gen in gens] if g.timings_per_token else None
    return await answer(request, gens, fmt, g.stream, g.include_usage)


async def answer(request: web.Request, gens: list[Generation], fmt: ReplyFormat, stream: bool,
                 include_usage: bool = False) -> web.StreamResponse:
    try:
        if not stream:
            results = await asyncio.gather(*(g.collect() for g in gens))
            for res in results:
                err = failure(res.finished)
                if err is not None:
                    raise err
            return json_response(fmt.body(list(results)))
        sse = EventStream(request)
        try:
            await _stream(sse, gens, fmt, include_usage)
        except ClientGone:
            for g in gens:
                g.cancel()
        return await sse.finish()
    finally:
        for g in gens:
            g.close()


async def _stream(sse: EventStream, gens: list[Generation], fmt: ReplyFormat,
                  include_usage: bool) -> None:
    await sse.start()
    for i in range(len(gens)):
        await _send(sse, fmt.opening(i))
    fins: list[Finished] = []
    async for i, ev in _merged(gens):
        if isinstance(ev, Finished):
            err = failure(ev)
            if err is not None:
                await _send(sse, fmt.error(err))
                break
            fins.append(ev)
            out = fmt.closing(i, ev)
        elif isinstance(ev, Progress):
            out = fmt.progress(i, ev)
        else:
            out = fmt.chunk(i, ev)
        await _send(sse, out)
    else:
        if include_usage:
            await _send(sse, fmt.usage(fins))
    if fmt.done_marker:
        await sse.done()


async def _send(sse: EventStream, out: dict | Named | list | None) -> None:
    for item in out if isinstance(out, list) else [] if out is None else [out]:
        await sse.send(item)


async def _merged(gens: list[Generation]) -> AsyncIterator[tuple[int, object]]:
    """(index, event) of every generation as they come; each ends with its Finished."""
    if len(gens) == 1:                       # the common case, without the fan-in
        async for ev in gens[0].events():
            yield 0, ev
        yield 0, gens[0].finished
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, g: Generation) -> None:
        async for ev in g.events():
            queue.put_nowait((i, ev))
        queue.put_nowait((i, g.finished))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(gens)
        while left:
            i, ev = await queue.get()
            left -= isinstance(ev, Finished)
            yield i, ev
    finally:
        for t in tasks:
            t.cancel()
