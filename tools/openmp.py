"""OpenMP's wait policy for ckptd's processes, set before torch is imported.

torch's ops and the C kernels (kernels/*/cpu.c) share torch's libgomp. By default its
threads spin for a while after each parallel region; a decode step is ~150 short
regions with Python in between, so the idle threads spin through most of the step.
On a machine whose cores are shared, that spinning takes the cores the other threads
need, and every region's barrier waits for a descheduled spinner: SmolLM2's decode at
two threads cost 0.69 CPU-seconds a token against 0.06 with passive waits
(docs/BENCHMARKS.md, "Decode step on the CPU"). libgomp reads the policy once, when
it loads, so this runs first; a policy or spin count the user set is kept.
"""

from __future__ import annotations

import os


def wait_passively() -> None:
    """OMP_WAIT_POLICY=PASSIVE unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
