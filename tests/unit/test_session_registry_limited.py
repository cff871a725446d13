"""The set of (shard, type) a concurrency limit held back keeps only the types of the process's
worker streams: a type leaves it with the last stream that leases it (and is "maybe ready" again for
the next one), instead of staying for every type ever held back here."""

from __future__ import annotations

from types import SimpleNamespace

from dispatcher.config import Settings
from dispatcher.queue.sessions import SessionContext, SessionRegistry, WorkerSession
from dispatcher.queue.working_set import LeaseRound
from shardmap import shard_for


async def _nothing(*_: object) -> None:
    return None


def _stream(registry: SessionRegistry, settings: Settings, types: list[str]) -> WorkerSession:
    context = SessionContext(
        settings=settings, registry=registry, ownership=None, working_set=None,  # type: ignore[arg-type]
        writer=SimpleNamespace(attempt_history=False),  # type: ignore[arg-type]
        lease_deadline=lambda shard, deadline: None, on_leased=lambda grants: None, return_unsent=_nothing,
    )  # fmt: skip
    session = WorkerSession(context, "worker-1", types, 10, "peer")
    registry.add(session)
    return session


async def test_a_held_back_type_leaves_limited_with_its_last_stream() -> None:
    settings, registry = Settings(), SessionRegistry()
    billing, mail = "billing.charge", "mail.send"
    first = _stream(registry, settings, [billing])
    second = _stream(registry, settings, [billing, mail])
    for session, job_type in ((first, billing), (second, mail)):
        shard = shard_for(job_type, settings.shard_count)
        session._held_back(shard, LeaseRound([], [], held_back=[(job_type, "concurrency")]))
        registry.hints.mark_empty(shard, [job_type], [0, 1, 2], registry.hints.version)
    assert len(registry.limited) == 2

    registry.remove(first)  # the other stream still leases billing: it stays
    assert registry.limited == {
        (shard_for(billing, settings.shard_count), billing),
        (shard_for(mail, settings.shard_count), mail),
    }
    registry.remove(second)
    assert registry.limited == set()
    shard = shard_for(billing, settings.shard_count)
    assert registry.hints.maybe(shard, [billing], 1)
