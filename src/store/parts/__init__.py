"""The parts of an agent's record that a turn writes besides its messages and fields.

One module per part (``memory.py``, ``conversations.py``,
``conversation_fields.py``, ``alarms.py``), each with its SQL, written once for
both engines; ``versioned.py`` holds what they share.
"""
