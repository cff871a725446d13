"""Workflows (issue 21) as users of queues know them, built on ``depends_on`` alone: each helper
returns the job specs of one ``enqueue_many`` (one transaction, all or nothing), each job named by a
``ref`` within it.

- ``chain(a, b, c)``: b waits for a, c for b (each reads the previous one's result with
  ``ctx.dependency_results()``); under "fail", a failure cancels the rest.
- ``group([...]).then(callback)``: the children run in parallel; the callback runs once, after
  every child finished, and reads every child's result (a chord, without polling).
- ``Batch(on_success=..., on_complete=...)``: ``on_complete`` runs once every job of the batch
  finished, whatever their outcomes; ``on_success`` only if they all succeeded (cancelled with
  ``dependency_failed`` otherwise). A running job of the batch adds jobs to it
  (``Client.add_to_batch``) before it finishes, so the callbacks, which wait for it, cannot fire
  before the new jobs are theirs too.

With a ``key``, every job of a group or batch gets an idempotency key derived from it, so a retried
enqueue (after a timeout, say) creates nothing twice: the callbacks have deterministic identities.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JobSpecDict = dict[str, Any]


def job(job_type: str, payload: Any = None, **options: Any) -> JobSpecDict:
    """A job for a workflow: ``Client.enqueue``'s arguments as a dict."""
    return {"type": job_type, "payload": payload, **options}


def _named(jobs: Iterable[Mapping[str, Any]], prefix: str, key: str | None) -> list[JobSpecDict]:
    out = []
    for i, spec in enumerate(jobs):
        copied = dict(spec)
        copied.setdefault("ref", f"{prefix}{i}")
        if key is not None:
            copied.setdefault("idempotency_key", f"{key}:{i}")
        out.append(copied)
    return out


def _depending(spec: Mapping[str, Any], refs: Sequence[str], on_failure: str) -> JobSpecDict:
    copied = dict(spec)
    copied["depends_on"] = [*copied.get("depends_on", ()), *((r, on_failure) for r in refs)]
    return copied


def chain(*jobs: Mapping[str, Any], on_failure: str = "fail", key: str | None = None) -> list[JobSpecDict]:
    """The specs of a chain: each job waits for the one before it. ``enqueue_many`` returns their
    ids in this order."""
    named = _named(jobs, f"chain-{secrets.token_hex(4)}-", key)
    return [named[0], *(_depending(s, [named[i]["ref"]], on_failure) for i, s in enumerate(named[1:]))]


@dataclass(frozen=True)
class Group:
    """Jobs that run in parallel; ``then`` adds the job that waits for them all."""

    jobs: tuple[Mapping[str, Any], ...]
    key: str | None = None

    def then(self, callback: Mapping[str, Any], on_failure: str = "fail") -> list[JobSpecDict]:
        """The specs: the children, then the callback (last in ``enqueue_many``'s ids), which
        waits for every child (``on_failure="ignore"``: runs even when some failed)."""
        named = _named(self.jobs, f"group-{secrets.token_hex(4)}-", self.key)
        last = dict(callback)
        if self.key is not None:
            last.setdefault("idempotency_key", f"{self.key}:then")
        return [*named, _depending(last, [s["ref"] for s in named], on_failure)]


def group(jobs: Iterable[Mapping[str, Any]], key: str | None = None) -> Group:
    return Group(tuple(jobs), key)


@dataclass(frozen=True)
class Batch:
    """The callbacks of a batch of jobs (see the module's doc)."""

    on_success: Mapping[str, Any] | None = None
    on_complete: Mapping[str, Any] | None = None
    key: str | None = None

    def specs(self, jobs: Iterable[Mapping[str, Any]]) -> list[JobSpecDict]:
        """The batch's first jobs, then on_success, then on_complete (those given)."""
        named = _named(jobs, f"batch-{secrets.token_hex(4)}-", self.key)
        if not named:
            raise ValueError("a batch starts with at least one job")
        refs = [s["ref"] for s in named]
        out = list(named)
        for name, callback, policy in (
            ("success", self.on_success, "fail"),
            ("complete", self.on_complete, "ignore"),
        ):
            if callback is not None:
                spec = dict(callback)
                if self.key is not None:
                    spec.setdefault("idempotency_key", f"{self.key}:{name}")
                out.append(_depending(spec, refs, policy))
        return out

    def opened(self, ids: Sequence[str]) -> OpenBatch:
        """The batch, from ``enqueue_many(self.specs(...))``'s ids."""
        n = (self.on_success is not None) + (self.on_complete is not None)
        callbacks = list(ids[len(ids) - n :])
        success = callbacks.pop(0) if self.on_success is not None else ""
        complete = callbacks.pop(0) if self.on_complete is not None else ""
        return OpenBatch(success, complete, tuple(ids[: len(ids) - n]))


@dataclass(frozen=True)
class OpenBatch:
    """An enqueued batch: its callbacks' ids (empty: none) and its first jobs' ids. ``token`` names
    it in a payload, for a job of the batch that adds jobs to it (``OpenBatch.from_token``)."""

    success_id: str
    complete_id: str
    job_ids: tuple[str, ...] = ()

    @property
    def token(self) -> str:
        return f"{self.success_id},{self.complete_id}"

    @classmethod
    def from_token(cls, token: str) -> OpenBatch:
        success, _, complete = token.partition(",")
        return cls(success, complete)

    def add_specs(self, jobs: Iterable[Mapping[str, Any]]) -> list[JobSpecDict]:
        """Jobs joining the batch: each blocks the callbacks (with their policies)."""
        out = []
        for spec in jobs:
            copied = dict(spec)
            copied["blocks"] = [
                *copied.get("blocks", ()),
                *(((self.success_id, "fail"),) if self.success_id else ()),
                *(((self.complete_id, "ignore"),) if self.complete_id else ()),
            ]
            out.append(copied)
        return out
