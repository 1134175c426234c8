"""The agent's SQL workspace: tables of its own, versioned with its turns.

``schema.py`` reads the developer's declaration; ``sandbox.py`` says what an
agent's SQL may do; ``log.py`` is each agent's tables, version by version, in
the main database; ``cache.py`` the SQLite files on this machine caught up from
that log; ``workspace.py`` a turn's transaction on them, and the developer's
reads; ``part.py`` how the log follows a rollback, fork, prune and delete. It
imports the engine seam, the SQLite engine's ``damage.py`` and ``translate.py``
(the files are SQLite on both engines) and ``errors``; never ``parts/`` beside
it, nor the Store above.
"""
