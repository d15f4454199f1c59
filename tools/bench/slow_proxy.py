"""A TCP proxy on loopback that makes a server slow, for remote-tier faults and figures.

Every chunk that passes, either way, waits `delay` seconds (a request and its answer:
two delays, a round trip), then len/`rate` seconds when a rate (bytes/s, per
connection and direction) is set. `latency` is a network's: every byte arrives that
many seconds after it was sent, each way, without slowing the bytes behind it (a
request costs 2 x latency more, however large its answer). `stall` holds every byte
until it is cleared: connections open, nothing answers (a remote that hangs). All can
change while it runs. The loop runs on a thread of its own; `stop()` closes every
connection.
"""

from __future__ import annotations

import asyncio
import threading


class SlowProxy:
    def __init__(self, target_port: int, delay: float = 0.0, rate: float | None = None,
                 stall: bool = False, latency: float = 0.0) -> None:
        self.target = target_port
        self.delay, self.rate, self.stall, self.latency = delay, rate, stall, latency
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="slow-proxy",
                                       daemon=True)
        self.server: asyncio.base_events.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    def start(self) -> SlowProxy:
        self.thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop)
        self.server = fut.result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            tr, tw = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            cw.close()
            return
        self.writers |= {cw, tw}
        try:
            await asyncio.gather(self._pipe(cr, tw), self._pipe(tr, cw))
        except asyncio.CancelledError:        # stop(): the connections close with it
            pass
        self.writers -= {cw, tw}

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        sent: asyncio.Queue = asyncio.Queue()        # (when it arrives, bytes); b"": end
        deliver = asyncio.ensure_future(self._deliver(sent, writer))
        try:
            while True:
                data = await reader.read(1 << 16)
                sent.put_nowait((loop.time() + self.latency, data))
                if not data:
                    break
        except (OSError, asyncio.CancelledError):
            sent.put_nowait((0.0, b""))
        await asyncio.gather(deliver, return_exceptions=True)

    async def _deliver(self, sent: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, data = await sent.get()
                if not data:
                    break
                while self.stall:
                    await asyncio.sleep(0.05)
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                if self.delay:
                    await asyncio.sleep(self.delay)
                if self.rate:
                    await asyncio.sleep(len(data) / self.rate)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        async def shut() -> None:
            self.server.close()
            for w in list(self.writers):
                w.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
