"""The subscriber side: the statements that apply commands there, and the data validation
that compares a subscriber's tables with the publisher's.

Owns: ``statements`` (one prepared statement per article and operation, with the row-not-found
check) and ``validation`` (order- and encoding-independent checksums, differing keys).

May import: ``errors``, ``model``, ``postgres``, ``articles``, ``codegen`` and ``state``.
"""
