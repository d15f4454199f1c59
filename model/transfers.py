"""Copies of sequence state between the device and the host, off the compute stream.

On CUDA a checkpoint's state goes to pinned host memory on a side stream, after an
event that orders it behind the step that computed it; the step after it runs
meanwhile, and the host waits for the copies only when the checkpoint is stored
(`wait`, at the next admission or when idle), not after the step. A restore copies
host values into the pool on the side stream too, and the compute stream waits for
that on the device (an event), never the host. Off CUDA these are plain copies: the
device is the host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


class Transfers:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._pending: list = []           # events of device -> host copies in flight
        self._defer = 0

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside: to_host returns before its copy is done; wait() waits for them."""
        self._defer += 1
        try:
            yield
        finally:
            self._defer -= 1

    def index(self, ids: list[int]) -> torch.Tensor:
        """int64 ids on the device, without the host waiting (pinned, asynchronous)."""
        t = torch.tensor(ids, dtype=torch.long, device="cpu")
        if not self.cuda:
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A host copy of a device tensor nobody writes any more (a fresh gather or
        clone). Inside deferred(), on CUDA, it is valid once wait() has returned."""
        if not self.cuda:
            return t
        out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            out.copy_(t, non_blocking=True)
        t.record_stream(self.stream)       # its memory is not reused before the copy
        done = torch.cuda.Event()
        done.record(self.stream)
        if self._defer:
            self._pending.append(done)
        else:
            done.synchronize()
        return out

    def wait(self) -> None:
        """Wait for the device -> host copies issued so far."""
        pending, self._pending = self._pending, []
        for done in pending:
            done.synchronize()

    def to_device(self, write: Callable[[torch.Tensor], None], host: torch.Tensor) -> None:
        """write(device copy of host) into the pool, ordered before the next step."""
        if not self.cuda:
            write(host.to(self.device))
            return
        self.wait()               # a deferred host copy is what is being written back
        compute = torch.cuda.current_stream(self.device)
        # the pages may have held another sequence's state that a queued step still reads
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            write(host.to(self.device, non_blocking=True))
        compute.wait_stream(self.stream)
