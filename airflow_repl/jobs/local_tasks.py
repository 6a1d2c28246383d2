"""Running an agent's tasks in threads of this process, where a local Spark application would only
add its start: the CLI's Snapshot Agent when no Spark master is named.

A local master spreads tasks over this machine's cores and nothing else; so do threads here,
without a JVM to start (4 to 10 s on a small machine) and without Python workers to fork and
import the engine again.  The tasks are the Spark tasks' own functions: they read and load with
libraries that release the GIL while they work (ADBC and Arrow's C++, libpq's COPY).

:class:`LocalTasks` offers what the engine uses of a ``SparkSession`` (``sparkContext`` with
``defaultParallelism``, ``parallelize(...).map(f).collect()`` and ``accumulator``), so the agent
runs unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class Accumulator:
    """A counter tasks add to from any thread (Spark's ``Accumulator``: ``add`` and ``value``)."""

    def __init__(self, value: int) -> None:
        self._value = value
        self._lock = threading.Lock()

    def add(self, term: int) -> None:
        with self._lock:
            self._value += term

    @property
    def value(self) -> int:
        with self._lock:
            return self._value


class TaskList:
    """Tasks to run (Spark's ``RDD`` as far as the agents use it): ``map`` then ``collect``."""

    def __init__(self, items: list[Any], threads: int, functions: tuple[Callable[[Any], Any], ...] = ()) -> None:
        self._items, self._threads, self._functions = items, threads, functions

    def map(self, f: Callable[[Any], Any]) -> TaskList:
        return TaskList(self._items, self._threads, (*self._functions, f))

    def _run(self, item: Any) -> Any:
        for f in self._functions:
            item = f(item)
        return item

    def collect(self) -> list[Any]:
        """Every task's result, in the tasks' order; the first task to fail raises its error
        (the tasks not started yet are cancelled, the running ones end first)."""
        if not self._items:
            return []
        with ThreadPoolExecutor(
            max_workers=max(1, min(self._threads, len(self._items))), thread_name_prefix="task"
        ) as pool:
            futures = [pool.submit(self._run, item) for item in self._items]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise


class LocalContext:
    """What the agents use of a ``SparkContext``."""

    applicationId = None

    def __init__(self, threads: int) -> None:
        self.defaultParallelism = threads

    def parallelize(self, c: Iterable[Any], numSlices: int | None = None) -> TaskList:
        return TaskList(list(c), self.defaultParallelism)

    def accumulator(self, value: int) -> Accumulator:
        return Accumulator(value)


class LocalTasks:
    """A stand-in for a ``SparkSession``: the agent's tasks run in ``threads`` threads of this process."""

    def __init__(self, threads: int) -> None:
        self.sparkContext = LocalContext(max(1, threads))
