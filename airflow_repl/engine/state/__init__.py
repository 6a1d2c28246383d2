"""Where the agents keep their state: the distribution database, and the small
``airflow_repl`` schema at each subscriber (the watermark of the last applied transaction and
the ledger of loaded snapshot files).

Owns: ``distdb``, the schema of both and one function per question an agent asks of them.

May import: ``errors``, ``model``, ``postgres`` and ``articles``.
"""
