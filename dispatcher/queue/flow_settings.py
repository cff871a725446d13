"""Changes to a job type's settings (flow control and retention), wherever they come from (an RPC,
the queues file): read, changed and validated in one DB transaction (an invalid change writes
nothing), then mirrored.

Any valid job type name may be given settings, with jobs of the type or not yet: limits and pauses
are declared ahead of the jobs they hold back. Settings equal to the defaults are stored as no row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import structlog

from shardq_common.errors import InvalidArgument, StoreUnavailable

from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from ..store import Store
from . import validation
from .flow import ALL_CLASSES, QueueSettings, validated
from .flow_mirror import FlowMirror
from .states import Priority

log = structlog.get_logger("shardq.flow_settings")
#: The settings' fields a change may name (QueueSettings' own, but the type).
FIELDS = (
    "paused",
    "concurrency",
    "key_concurrency",
    "key_concurrency_overrides",
    "key_weights",
    "rate",
    "key_rate",
    "retain_finished_s",
    "retain_dead_s",
)


def fields_of(given: QueueSettings, names: Iterable[str]) -> Callable[[QueueSettings], QueueSettings]:
    """A change that sets the named fields to ``given``'s values and keeps the others."""
    chosen = dict.fromkeys(names)
    return lambda current: replace(current, **{name: getattr(given, name) for name in chosen})


def pausing(classes: frozenset[Priority]) -> Callable[[QueueSettings], QueueSettings]:
    return lambda current: replace(current, paused=current.paused | classes)


def resuming(classes: frozenset[Priority]) -> Callable[[QueueSettings], QueueSettings]:
    return lambda current: replace(current, paused=current.paused - classes)


def classes_of(priority: Priority | None) -> frozenset[Priority]:
    return ALL_CLASSES if priority is None else frozenset({priority})


class FlowSettings:
    def __init__(self, store: Store, mirror: FlowMirror) -> None:
        self.store = store
        self.mirror = mirror

    async def change(
        self, job_type: str, change: Callable[[QueueSettings], QueueSettings], *, field_prefix: str = ""
    ) -> tuple[QueueSettings, bool]:
        """Apply ``change`` to the type's settings. Returns them and whether they changed.
        InvalidArgument (its field named with ``field_prefix``) leaves them as they were."""
        validation.job_type(job_type, "type")
        outcome: dict[str, QueueSettings] = {}

        def apply(stored: dict[str, Any] | None) -> dict[str, Any] | None:
            current = QueueSettings.from_json(job_type, stored) if stored else QueueSettings(job_type)
            try:
                new = validated(change(current))
            except InvalidArgument as exc:
                raise InvalidArgument(f"{field_prefix}{exc}") from None
            outcome["old"], outcome["new"] = current, new
            return None if new.is_default else new.to_json()

        await self.store.update_queue_settings(job_type, apply)
        old, new = outcome["old"], outcome["new"]
        if new != old:
            log.info("queue settings changed", type=job_type, settings=new.to_json())
            try:
                await self.mirror.changed(job_type)
            except REDIS_ERRORS as exc:
                # Committed: the owner's next pass mirrors it (within a second of Redis coming back).
                note_redis_error("flow-mirror", exc, type=job_type)
            except StoreUnavailable as exc:  # committed, but not read back: the next pass mirrors it
                log.warning("queue settings saved, not mirrored yet", type=job_type, error=str(exc))
        return new, new != old

    async def get(self, job_type: str) -> tuple[QueueSettings, int]:
        """The type's settings from the DB and when they last changed (0: never set)."""
        validation.job_type(job_type, "type")
        row = await self.store.get_queue_settings(job_type)
        if row is None:
            return QueueSettings(job_type), 0
        return QueueSettings.from_json(job_type, row.settings), row.updated_at

    async def all(self) -> dict[str, tuple[QueueSettings, int]]:
        return {
            r.job_type: (QueueSettings.from_json(r.job_type, r.settings), r.updated_at)
            for r in await self.store.list_queue_settings()
        }
