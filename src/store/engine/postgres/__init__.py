"""The PostgreSQL engine (psycopg): a connection pool, a renewed lease per agent held.

``database.py`` is the Database a Store holds; ``holds.py`` the agents it
holds, by lease rows renewed in the server's clock; ``connections.py`` the
connections' options, deadline and check; ``opening.py`` connecting, which tells a
server's lasting refusal from one that may pass;
``schema.py`` and ``schema.sql`` are the schema and its migrations. Nothing here
LISTENs or NOTIFYs: readers poll (``engine/watch.py``).
It imports ``engine/seam.py``, ``engine/watch.py`` and ``errors`` only, and
psycopg only when a Store opens a ``postgresql://`` URL.
"""
