"""The SQLite engine (apsw): one file, a connection per thread, file locks per agent.

``database.py`` is the Database a Store holds; ``connection.py`` opens the file
(identify, migrate, pragmas); ``migrations.py`` and ``schema.sql`` are the
schema; ``row_checks.py`` keeps every row's checksum; ``damage.py`` and
``translate.py`` turn SQLite's reports into our errors; ``locks.py`` holds an
agent against other threads and processes. It imports ``engine/seam.py`` and
``errors`` only. The agents' SQL workspace files are SQLite on both engines, so
``workspace/`` uses ``damage.py`` and ``translate.py`` too.
"""
