"""The databases the store runs on: the seam, and an engine on each side of it.

``seam.py`` is what the store's shared logic needs of a database; ``sqlite/``
(apsw, one file) and ``postgres/`` (psycopg, a pool) are the two engines that
provide it, each with its own SQL, schema and migrations.
"""
