"""Articles resolved against the publisher's catalog, and the commands recorded on them.

Owns: ``resolved`` (:class:`~airflow_repl.engine.articles.resolved.ResolvedArticle`, a model
article plus its table's columns, key and definition hash) and ``commands``
(:class:`~airflow_repl.engine.articles.commands.Command`, one row change of an article, as the
Log Reader records it and the Distribution Agent applies it).

May import: ``errors``, ``model``, ``mariadb`` and ``postgres``.
"""
