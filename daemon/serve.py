"""`ckptd serve`: run the HTTP daemon.

The HTTP side runs its event loop on a thread of its own; the process's main
thread runs the engine's loop, which owns the model (Engine.run says why). The
port opens first and the model loads on a thread, so /health answers 503 while
loading. SIGTERM (or SIGINT) stops new work, lets running requests finish for
--drain-timeout seconds, cancels the rest, flushes the cache writer and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from aiohttp import web

from ckptd.daemon import config, flags, lora
from ckptd.daemon.cachedir import prepare_cache_dir
from ckptd.daemon.http.vertex import Vertex

if TYPE_CHECKING:
    from ckptd.daemon.service import Service

log = logging.getLogger("ckptd")


def add_arguments(parser) -> None:
    flags.add_arguments(parser)
    lora.add_arguments(parser)


def run(args) -> int:
    cfg = flags.from_args(args)
    if cfg.device != "cpu":
        # `--device cuda` without CUDA: one line before the port opens (imports torch)
        from ckptd.model.placement import resolve
        resolve(cfg.device, cfg.dtype)
    aip = Vertex.from_env(os.environ)
    if aip.enabled and aip.port is not None and aip.port != cfg.port:
        # Vertex AI sends its traffic to AIP_HTTP_PORT, whatever the flags say
        cfg = replace(cfg, port=aip.port)
    lock = prepare_cache_dir(cfg.cache_dir)
    _setup_logging(cfg.log_format)
    try:
        return _run(cfg)
    finally:
        lock.close()


class _Http:
    """The event loop's thread, and what the main thread needs of it."""

    def __init__(self, cfg: config.ServeConfig, svc: Service) -> None:
        self.cfg, self.svc = cfg, svc
        self.code = 1
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None
        self.stop_requested = False
        self.loaded_or_failed = threading.Event()   # or the loop ended
        self.thread = threading.Thread(target=self._main, name="ckptd-http")

    def _main(self) -> None:
        try:
            self.code = asyncio.run(serve(self.cfg, self.svc, self))
        finally:
            self.loaded_or_failed.set()

    def request_stop(self, *_) -> None:      # a signal handler: runs on the main thread
        self.stop_requested = True
        loop = self.loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self.stop.set)
            except RuntimeError:                 # the loop has ended: nothing to stop
                pass


def _run(cfg: config.ServeConfig) -> int:
    # Imported here, not at the top: a bad flag is reported without importing torch.
    from ckptd.daemon.service import READY, Service

    svc = Service(cfg)
    http = _Http(cfg, svc)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, http.request_stop)
    http.thread.start()
    http.loaded_or_failed.wait()
    if svc.state == READY and not http.stop_requested:
        svc.rt.engine.run()                  # until the HTTP side's shutdown stops it
    http.thread.join()
    if svc.rt is not None and svc.rt.engine.broken:
        from ckptd.daemon.runtime import CHECK_FAILED_EXIT  # (torch: see above)
        log.error("exiting with %d: a cache invariant was broken", CHECK_FAILED_EXIT)
        return CHECK_FAILED_EXIT
    return http.code


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _setup_logging(fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


async def serve(cfg: config.ServeConfig, svc: Service, http: _Http) -> int:
    # imported here, as in _run: the flags are checked before torch is imported
    from ckptd.daemon.console import ConsoleProgress
    from ckptd.daemon.http.app import build_app
    from ckptd.daemon.service import FAILED

    runner = web.AppRunner(build_app(svc), handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0)
    await runner.setup()
    for host in cfg.hosts:
        try:
            await web.TCPSite(runner, host.strip("[]"), cfg.port).start()
        except OSError as e:
            log.error("cannot listen on %s:%d: %s", host, cfg.port, e)
            await runner.cleanup()
            return 1
    for host, port in [a[:2] for a in runner.addresses]:
        log.info("listening on http://%s:%d", host, port)
    if not cfg.loopback and cfg.api_key is None:
        log.warning("listening on %s without --api-key: anyone who can reach this host "
                    "may use the daemon and read or clear its cache", cfg.host)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    http.stop, http.loop = stop, loop
    if http.stop_requested:
        stop.set()
    loaded = asyncio.Event()

    def load() -> None:                      # a daemon thread: SIGTERM need not wait for it
        try:
            svc.load(start=False)            # the main thread runs the engine
        except Exception as e:
            svc.state, svc.error = FAILED, f"{type(e).__name__}: {e}"
            log.error("model load failed: %s", svc.error)
        loop.call_soon_threadsafe(loaded.set)
        http.loaded_or_failed.set()

    console = ConsoleProgress()
    threading.Thread(target=load, name="ckptd-load", daemon=True).start()
    with console.loading(svc.model_id):
        await _first(stop.wait(), loaded.wait())
    code = 1 if svc.state == FAILED else 0
    background = []
    if loaded.is_set() and code == 0 and not stop.is_set():
        background = [asyncio.ensure_future(_pump_metrics(svc)),
                      asyncio.ensure_future(svc.history.run(svc.rt)),
                      asyncio.ensure_future(_save_departures(svc)),
                      asyncio.ensure_future(console.watch_prefills(svc.rt.engine.scheduler))]
        await stop.wait()
    log.info("shutting down")
    for task in background:
        task.cancel()
    await _shutdown(svc, runner, loaded.is_set())
    log.info("stopped")
    return code


async def _first(*aws) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:
        t.cancel()


async def _pump_metrics(svc: Service, period: float = 5.0) -> None:
    while True:
        await asyncio.sleep(period)
        svc.metrics.drain(svc.rt.engine)


async def _save_departures(svc: Service, period: float = 60.0) -> None:
    """The records of departed entries, saved beside the store every minute while they
    change (cache/why/gone.py): `ckptd inspect why` reads them beside a running daemon."""
    store = svc.rt.store
    while True:
        await asyncio.sleep(period)
        await asyncio.get_running_loop().run_in_executor(None, store.gone.save, store.path,
                                                         True)


async def _shutdown(svc: Service, runner: web.AppRunner, loaded: bool) -> None:
    from ckptd.daemon.service import DRAINING, FAILED  # (torch: see serve)

    loaded = loaded and svc.state != FAILED
    svc.state = DRAINING                   # new generation requests now get 503
    deadline = time.monotonic() + svc.cfg.drain_timeout
    while loaded and svc.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if loaded and svc.inflight:
        log.info("cancelling %d request(s) still running", svc.inflight)
    loop = asyncio.get_running_loop()
    if loaded:
        await loop.run_in_executor(None, svc.rt.engine.stop)
    await runner.cleanup()                 # closes the port; waits for handlers to answer
    if loaded:
        await loop.run_in_executor(None, svc.rt.cache.close)   # flushes the writer
