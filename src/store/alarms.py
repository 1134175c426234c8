"""Alarm schedules, where the API reference names them: ``effectful_durable.store.alarms``.

:meth:`Store.schedule_alarm <effectful_durable.Store.schedule_alarm>` takes a
:class:`Schedule`, made by :func:`make_schedule`; :meth:`Store.alarms
<effectful_durable.Store.alarms>` returns :class:`AlarmInfo` rows, each with an
:data:`AlarmStatus`. The alarms part itself (its SQL, and how alarms follow the
agent's versions) is ``store/parts/alarms.py``.
"""

from .parts.alarms import AlarmInfo, AlarmStatus, Schedule, make_schedule

__all__ = ["AlarmInfo", "AlarmStatus", "Schedule", "make_schedule"]
