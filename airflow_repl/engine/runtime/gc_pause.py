"""Python's cyclic garbage collector paused while an agent applies a batch.

A batch allocates many small objects that live until it is applied (a net-change chunk holds up
to ``CHUNK_COMMANDS`` commands, their images and the rows of its statements).  The cyclic
collector runs every few hundred allocations and, every so often, walks every object the process
holds, those of the imported modules included: on a Distribution Agent's batches it took 30 to
60 % of the agent's CPU (measured with ``make bench``'s workloads; see CHANGELOG.md).  The agents' objects do not form
reference cycles: reference counting frees them when the batch ends, collector or not.  So the
collector is paused for the batch and resumed after it, when whatever cycles the batch made (a
library's, say) are collected as usual; memory is not held longer than the batch.

Pauses nest and may overlap between threads (several agents in one process): the collector is
resumed when the last pause ends, and only if it was running when the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pauses = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """The block runs without the cyclic garbage collector (reference counting still frees)."""
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()
