"""The databases the store runs on: the seam, and an engine on each side of it.

``seam.py`` is what the store's shared logic needs of a database (Database,
Conn, Rows) and what a turn hands it (TurnWrite); ``sqlite/`` (apsw, one file)
and ``postgres/`` (psycopg, a pool) are the two engines that provide it, each
with its own SQL, schema and migrations. The seam imports nothing of ours; the
engines import the seam and ``errors``, never each other (what both need lives
in the seam), nor anything above them: the Store, not an engine, puts the parts
and the workspace cache together.
"""
