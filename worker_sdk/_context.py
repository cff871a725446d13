"""What a handler receives."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

_EVENT_MADE = threading.Lock()  # one event per context when several threads wait at once
#: The largest progress report, as JSON (the dispatcher's SHARDQ_MAX_PROGRESS_BYTES default).
MAX_PROGRESS_BYTES = 4096


@dataclass(frozen=True, slots=True)
class DependencyResult:
    """A finished dependency of the running job (issue 21)."""

    job_id: str
    type: str
    #: succeeded, dead or cancelled.
    state: str
    #: Its handler's result (bytes as returned; b"" for none, or when cut by the size bound).
    result: bytes
    truncated: bool = False

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"

    def json(self) -> Any:
        """The result decoded as JSON (None when it is empty)."""
        return json.loads(self.result) if self.result else None


@dataclass(slots=True)
class JobContext:
    """One execution of one job. Handlers must be idempotent: delivery is at-least-once.

    The worker asks a job to stop by setting :attr:`cancelled`: when the job is cancelled, when its
    lease is lost, when it runs past the worker's ``job_timeout``, and at shutdown once the grace
    is over. An async handler is also cancelled (``CancelledError`` at its next ``await``). A plain
    (sync) handler cannot be interrupted from outside its thread: it must check :attr:`cancelled`
    between steps, or wait with :meth:`wait_cancelled` instead of ``time.sleep``, and return (or
    raise) when it is set; past ``job_timeout`` the job is nacked at the timeout, whatever the
    handler returns later. Blocking calls it makes should carry their own timeouts shorter than
    ``job_timeout`` (a socket timeout, a database statement timeout): a handler that blocks past
    its timeout keeps its thread, and a worker whose threads are all held that way runs nothing
    until one returns.
    """

    #: The job's id (stable across attempts).
    job_id: str
    #: The job type (the handler name).
    type: str
    #: The payload bytes, exactly as enqueued. ``json()`` decodes a JSON payload.
    payload: bytes
    #: 1 on the first lease; retries and re-deliveries after a crash count up.
    attempt: int
    max_attempts: int
    #: Priority class: "high", "default" or "low".
    priority: str
    #: When the current lease ends unless heartbeats extend it (they are automatic), epoch ms.
    deadline_ms: int
    #: The idempotency key given at enqueue, or "".
    idempotency_key: str
    #: The time the job was due to run, epoch ms.
    run_at_ms: int
    #: The lease token: part of the fencing the dispatcher checks on ack.
    token: str
    shard: int
    #: The concurrency key given at enqueue (a tenant, a customer), or "".
    concurrency_key: str = ""
    #: The headers given at enqueue: small string metadata, such as the W3C trace context
    #: (``traceparent``, ``tracestate``) the client injects when OpenTelemetry is installed.
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Issue 21: the outcomes of the jobs this one waited for (see :meth:`dependency_results`).
    dependencies: tuple[DependencyResult, ...] = ()
    # Set from the event loop, read from the handler's thread. The event a sync handler waits on
    # is made only when one waits: most jobs never need it, and it costs a lock and a condition.
    _cancelled: bool = field(default=False, repr=False, compare=False)
    _cancel_event: threading.Event | None = field(default=None, repr=False, compare=False)
    # Set by the worker: takes a job's progress report (JSON) from any thread.
    _report: Callable[[JobContext, str], None] | None = field(default=None, repr=False, compare=False)

    def dependency_results(self) -> dict[str, DependencyResult]:
        """The jobs this one waited for (``depends_on``), by id, in their id order: each one's type,
        how it finished ("succeeded", or "dead"/"cancelled" for a dependency under
        ``on_failure="ignore"``) and its handler's result. At most 4 MiB of results in all reach a
        job: past that a result is empty and its ``truncated`` is True."""
        return {d.job_id: d for d in self.dependencies}

    @property
    def id(self) -> str:
        """The job's id: the same as :attr:`job_id`, and as ``JobInfo.id`` for the client."""
        return self.job_id

    @property
    def deadline(self) -> datetime:
        """When the current lease ends unless heartbeats extend it (they are automatic)."""
        return ms_to_datetime(self.deadline_ms)

    @property
    def run_at(self) -> datetime:
        """The time the job was due to run."""
        return ms_to_datetime(self.run_at_ms)

    def json(self) -> Any:
        return json.loads(self.payload) if self.payload else None

    @property
    def cancelled(self) -> bool:
        """True once the worker asked the job to stop (cancelled, lease lost, past ``job_timeout``,
        shut down): a sync handler should stop early."""
        return self._cancelled

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block until :attr:`cancelled` is set or ``timeout`` seconds pass; return :attr:`cancelled`.

        For sync handlers: ``ctx.wait_cancelled(5)`` in place of ``time.sleep(5)`` pauses and stops
        at once when the job should. Do not call it from an async handler (it blocks the loop)."""
        with _EVENT_MADE:
            if self._cancel_event is None:
                self._cancel_event = threading.Event()
        # _cancel sets the flag before it looks for the event, and the event is in place before the
        # flag is read here: either this sees the flag, or _cancel sees the event and sets it.
        if self._cancelled:
            return True
        return self._cancel_event.wait(timeout)

    def progress(self, value: float | Mapping[str, Any]) -> None:
        """Report how far the job is: a fraction from 0 to 1, or a small JSON-able dict (at most
        4 KiB as JSON), e.g. ``{"done": 420, "total": 1000}``. Cheap to call often, from a sync or
        an async handler: the worker sends the latest report a few times a second at most, and
        before the job's result, so a client watching the job (``Client.wait``,
        ``dispatcherctl job watch``) sees the last one. Raises ValueError for anything else."""
        if isinstance(value, bool) or not isinstance(value, int | float | Mapping):
            raise ValueError("progress must be a number from 0 to 1 or a dict")
        if isinstance(value, Mapping):
            try:
                text = json.dumps(dict(value), separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"progress is not JSON-able: {exc}") from None
            size = len(text.encode())
            if size > MAX_PROGRESS_BYTES:
                raise ValueError(f"progress is {size} bytes as JSON; the limit is {MAX_PROGRESS_BYTES}")
        else:
            if not (math.isfinite(value) and 0 <= value <= 1):
                raise ValueError(f"progress {value!r} is not a fraction from 0 to 1")
            text = json.dumps(value)
        report = self._report
        if report is not None:
            report(self, text)

    def _cancel(self) -> None:
        self._cancelled = True
        event = self._cancel_event
        if event is not None:
            event.set()


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
