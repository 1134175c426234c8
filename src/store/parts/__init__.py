"""The parts of an agent's record that a turn writes besides its messages and fields.

One module per part (``memory.py``, ``conversations.py``,
``conversation_fields.py``, ``alarms.py``), each with its SQL, written once for
both engines on the seam's Conn; ``versioned.py`` holds what they share
(VersionedPart: how a part follows a rollback, fork, prune and delete). They
import the engine seam, the shared leaves (``records.py``, ``rows.py``, ...)
and ``errors``; never ``workspace/`` beside them, nor the Store above.
"""
