"""Planning a batch over several subscription streams: pure logic, no server.

Owns :func:`plan_streams` (which commands may go to which stream: union-find over the key
values they touch), :func:`plan_batch` (the same over commands, with the tunables below) and
:class:`StreamChooser` (whether spreading pays, from the delivery rates measured so far), and
the tunables of both.  The tunables are read when they are used, so a test may patch them here
(``monkeypatch.setattr(stream_planning, "PARALLEL_MIN_COMMANDS", 2)``).

The Distribution Agent (:mod:`~airflow_repl.engine.agents.distribution_agent`) asks; the
subscriber side (:mod:`~airflow_repl.engine.subscriber.applier`) says which key values a
command touches and applies the shares.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

#: A batch with fewer commands is applied on one stream: two-phase commit on every stream
#: costs more than spreading so little work saves.
PARALLEL_MIN_COMMANDS = 64
#: A batch is spread only if its busiest stream gets at most 1 / PARALLEL_MIN_GAIN of its
#: commands (one group dominating the batch gains nothing from several streams).
PARALLEL_MIN_GAIN = 1.5
#: Larger batches (a single huge transaction) are applied on one stream without planning, so
#: that the agent's memory stays bounded.
PLAN_MAX_COMMANDS = 200_000
#: Several streams pay only where the subscriber and this client have cores to spare.  With
#: ADAPTIVE_STREAMS the agent times its spread batches and its one-stream batches (commands per
#: second) and spreads only while spreading is at least as fast; every STREAM_PROBE_EVERY-th
#: batch tries the other way again, so a change of load is noticed.  A run starts from the rates
#: the previous successful run of the subscription measured (kept in its history details).
ADAPTIVE_STREAMS = True
STREAM_PROBE_EVERY = 16

C = TypeVar("C")


class StreamChooser:
    """Decides, batch by batch, whether a batch may be spread over the streams, from the
    delivery rates measured so far in this run (a pure object: unit-tested without a server)."""

    def __init__(self, adaptive: bool = True, probe_every: int = STREAM_PROBE_EVERY) -> None:
        self.adaptive, self.probe_every = adaptive, probe_every
        self.rate: dict[bool, float | None] = {True: None, False: None}
        self.batches = 0

    def may_spread(self) -> bool:
        """Whether the next batch may be spread (the planner may still keep it on one stream)."""
        self.batches += 1
        spread, one = self.rate[True], self.rate[False]
        if not self.adaptive or spread is None:
            return True  # first try spreading
        if one is None:
            return False  # then one stream, to compare
        best = spread >= one
        return (not best) if self.batches % self.probe_every == 0 else best

    def resume(self, rates: dict[str, float]) -> None:
        """Start from the rates an earlier run measured (:meth:`rates`)."""
        self.rate[True], self.rate[False] = rates.get("spread"), rates.get("one")

    def rates(self) -> dict[str, float | None]:
        """The measured rates, for the next run: commands per second spread and on one stream."""
        return {"spread": self.rate[True], "one": self.rate[False]}

    def record(self, spread: bool, commands: int, seconds: float) -> None:
        """A batch of ``commands`` took ``seconds`` (spread over streams, or on one stream)."""
        if commands < PARALLEL_MIN_COMMANDS or seconds <= 0:
            return  # too small to say anything about rates
        rate = commands / seconds
        old = self.rate[spread]
        self.rate[spread] = rate if old is None else (old + rate) / 2


def worth_planning(streams: int, may_spread: bool, commands: int) -> bool:
    """Whether a batch of ``commands`` commands is planned over ``streams`` streams at all (the
    alternative: one stream reads the commands as it applies them, in bounded memory)."""
    return streams > 1 and may_spread and commands <= PLAN_MAX_COMMANDS


def plan_batch(commands: Sequence[C], touched: Callable[[C], Iterable[Hashable] | None], streams: int) -> list[list[C]]:
    """The commands of each stream, in commit order (:func:`plan_streams` over the key values
    ``touched`` names for each command, with this module's tunables)."""
    plan = plan_streams(
        [touched(c) for c in commands], streams, min_commands=PARALLEL_MIN_COMMANDS, min_gain=PARALLEL_MIN_GAIN
    )
    return [[commands[i] for i in share] for share in plan]


def plan_streams(
    touched: Sequence[Iterable[Hashable] | None],
    streams: int,
    *,
    min_commands: int = PARALLEL_MIN_COMMANDS,
    min_gain: float = PARALLEL_MIN_GAIN,
) -> list[list[int]]:
    """Spread a batch's commands over at most ``streams`` streams so that no two streams ever
    touch the same key value.

    ``touched[i]`` is every key value command ``i`` touches (``None``: it may touch anything,
    a TRUNCATE say).  Commands sharing a key value are connected (union-find); each connected
    group stays on one stream, in commit order, and the groups are balanced over the streams
    (largest first, onto the least loaded).  Returns the command indexes of each stream, each
    list in commit order; a single list when spreading does not pay: fewer than
    ``min_commands`` commands, one group, or a busiest stream holding more than
    1 / ``min_gain`` of the batch.
    """
    n = len(touched)
    everything = [list(range(n))]
    if streams <= 1 or n < max(min_commands, 2):
        return everything
    groups = _connected_groups(touched)
    if groups is None or len(groups) < 2:
        return everything
    assigned = _balance(groups, streams)
    if n < min_gain * max(len(a) for a in assigned):
        return everything
    return [sorted(a) for a in assigned if a]


def _connected_groups(touched: Sequence[Iterable[Hashable] | None]) -> list[list[int]] | None:
    """The commands connected by a common key value (union-find), each group in commit order;
    None when a command may touch anything."""
    parent = list(range(len(touched)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[Hashable, int] = {}
    for i, keys in enumerate(touched):
        if keys is None:
            return None
        for key in keys:
            j = owner.setdefault(key, i)
            if j != i:
                a, b = find(i), find(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(touched)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def _balance(groups: list[list[int]], streams: int) -> list[list[int]]:
    """Groups onto streams, largest first, each onto the least loaded stream."""
    loads = [(0, s) for s in range(streams)]
    assigned: list[list[int]] = [[] for _ in range(streams)]
    for group in sorted(groups, key=len, reverse=True):
        load, s = heapq.heappop(loads)
        assigned[s].extend(group)
        heapq.heappush(loads, (load + len(group), s))
    return assigned
