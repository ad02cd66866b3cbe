"""CPU time, the one clock every CPU-time figure reads (a fine-tune's energy, profile's per-run CPU time, tune's
trials and overhead).

``os.times`` counts in the kernel's clock ticks (10 ms on Linux): about ±5% of a tiny fine-tune's 0.2 s. This
process's own time comes from ``time.process_time`` (CLOCK_PROCESS_CPUTIME_ID, nanoseconds); its waited-for
children's from ``getrusage(RUSAGE_CHILDREN)`` (microseconds), ``os.times`` only where there is no ``resource``.
"""
from __future__ import annotations

import time


def cpu_seconds(children: bool = False) -> float:
    """CPU seconds (user + system, every thread's) of this process, and with ``children`` those of the child
    processes it has waited for."""
    own = time.process_time()
    if not children:
        return own
    try:
        import resource
    except ImportError:  # no getrusage (Windows): the tick-counted figure
        import os

        t = os.times()
        return own + t.children_user + t.children_system
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + r.ru_utime + r.ru_stime
