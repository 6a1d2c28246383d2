"""What every agent run stands on: its lifecycle, continuous mode, progress lines, the collector
pause and the turns taken at a queued subscriber.

Owns: ``lifecycle`` (:class:`~airflow_repl.engine.runtime.lifecycle.AgentRun`: lock, run
history, stale runs, error classification and outcome, progress and result), ``continuous``
(continuous mode of the Log Reader, Distribution and Queue Reader Agents: the options as data,
whether the loop takes another turn, SIGTERM, progress), ``progress_lines`` (the INFO progress
lines of long runs, at most every ``AIRFLOW_REPL_PROGRESS_INTERVAL`` seconds), ``gc_pause``
(Python's cyclic garbage collector paused while a batch is read or applied) and
``subscriber_writer`` (the turns the Distribution Agent and the Queue Reader take at a queued
subscriber: one batch, one queued transaction) and ``registry`` (every agent registered once: name,
label, continuous or not, one run per subscriber or not, the lock it shares).  A new agent is a module of
:mod:`airflow_repl.engine.agents` with only its own logic, run inside an ``AgentRun`` (the
lifecycle module's documentation says how to write one).

May import: ``errors``, ``model``, ``mariadb``, ``postgres``, ``articles``, ``codegen``, ``state`` and
``subscriber``.
"""
