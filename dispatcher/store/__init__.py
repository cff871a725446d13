"""The durable store: the source of truth for job status (PostgreSQL or SQLite, one schema)."""

from __future__ import annotations

from .base import ATTEMPT_OUTCOMES, AttemptRow, AttemptUpdate, DeadFilter, JobRow, Store, StoreUpdate
from .open import open_store
from .queue_settings import QueueSettingsRow
from .schedules import Advance, ScheduleRow, StaleOccurrence
from .search import JobQuery, PayloadCondition, SearchPosition

__all__ = [
    "ATTEMPT_OUTCOMES",
    "Advance",
    "AttemptRow",
    "AttemptUpdate",
    "DeadFilter",
    "JobQuery",
    "JobRow",
    "PayloadCondition",
    "QueueSettingsRow",
    "ScheduleRow",
    "SearchPosition",
    "StaleOccurrence",
    "Store",
    "StoreUpdate",
    "open_store",
]
