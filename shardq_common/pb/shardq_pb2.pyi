from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_HIGH: _ClassVar[Priority]
    PRIORITY_DEFAULT: _ClassVar[Priority]
    PRIORITY_LOW: _ClassVar[Priority]

class JobStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATUS_UNSPECIFIED: _ClassVar[JobStatus]
    JOB_STATUS_DELAYED: _ClassVar[JobStatus]
    JOB_STATUS_READY: _ClassVar[JobStatus]
    JOB_STATUS_LEASED: _ClassVar[JobStatus]
    JOB_STATUS_SUCCEEDED: _ClassVar[JobStatus]
    JOB_STATUS_DEAD: _ClassVar[JobStatus]
    JOB_STATUS_CANCELLED: _ClassVar[JobStatus]
    JOB_STATUS_WAITING: _ClassVar[JobStatus]

class DependencyPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEPENDENCY_POLICY_UNSPECIFIED: _ClassVar[DependencyPolicy]
    DEPENDENCY_POLICY_FAIL: _ClassVar[DependencyPolicy]
    DEPENDENCY_POLICY_IGNORE: _ClassVar[DependencyPolicy]

class DeadReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEAD_REASON_UNSPECIFIED: _ClassVar[DeadReason]
    DEAD_REASON_HANDLER_ERROR: _ClassVar[DeadReason]
    DEAD_REASON_NOT_RETRYABLE: _ClassVar[DeadReason]
    DEAD_REASON_LEASE_EXPIRED: _ClassVar[DeadReason]
    DEAD_REASON_NO_HANDLER: _ClassVar[DeadReason]

class AttemptOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_OUTCOME_UNSPECIFIED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_SUCCEEDED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_FAILED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_LEASE_EXPIRED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_CANCELLED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_RATE_LIMITED: _ClassVar[AttemptOutcome]

class BulkAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BULK_ACTION_UNSPECIFIED: _ClassVar[BulkAction]
    BULK_ACTION_CANCEL: _ClassVar[BulkAction]
    BULK_ACTION_REQUEUE: _ClassVar[BulkAction]
    BULK_ACTION_RUN_NOW: _ClassVar[BulkAction]
    BULK_ACTION_DELETE: _ClassVar[BulkAction]

class CatchUp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CATCH_UP_UNSPECIFIED: _ClassVar[CatchUp]
    CATCH_UP_ALL: _ClassVar[CatchUp]
    CATCH_UP_LATEST: _ClassVar[CatchUp]
    CATCH_UP_NONE: _ClassVar[CatchUp]
PRIORITY_UNSPECIFIED: Priority
PRIORITY_HIGH: Priority
PRIORITY_DEFAULT: Priority
PRIORITY_LOW: Priority
JOB_STATUS_UNSPECIFIED: JobStatus
JOB_STATUS_DELAYED: JobStatus
JOB_STATUS_READY: JobStatus
JOB_STATUS_LEASED: JobStatus
JOB_STATUS_SUCCEEDED: JobStatus
JOB_STATUS_DEAD: JobStatus
JOB_STATUS_CANCELLED: JobStatus
JOB_STATUS_WAITING: JobStatus
DEPENDENCY_POLICY_UNSPECIFIED: DependencyPolicy
DEPENDENCY_POLICY_FAIL: DependencyPolicy
DEPENDENCY_POLICY_IGNORE: DependencyPolicy
DEAD_REASON_UNSPECIFIED: DeadReason
DEAD_REASON_HANDLER_ERROR: DeadReason
DEAD_REASON_NOT_RETRYABLE: DeadReason
DEAD_REASON_LEASE_EXPIRED: DeadReason
DEAD_REASON_NO_HANDLER: DeadReason
ATTEMPT_OUTCOME_UNSPECIFIED: AttemptOutcome
ATTEMPT_OUTCOME_SUCCEEDED: AttemptOutcome
ATTEMPT_OUTCOME_FAILED: AttemptOutcome
ATTEMPT_OUTCOME_LEASE_EXPIRED: AttemptOutcome
ATTEMPT_OUTCOME_CANCELLED: AttemptOutcome
ATTEMPT_OUTCOME_RATE_LIMITED: AttemptOutcome
BULK_ACTION_UNSPECIFIED: BulkAction
BULK_ACTION_CANCEL: BulkAction
BULK_ACTION_REQUEUE: BulkAction
BULK_ACTION_RUN_NOW: BulkAction
BULK_ACTION_DELETE: BulkAction
CATCH_UP_UNSPECIFIED: CatchUp
CATCH_UP_ALL: CatchUp
CATCH_UP_LATEST: CatchUp
CATCH_UP_NONE: CatchUp

class Dependency(_message.Message):
    __slots__ = ("job", "on_failure")
    JOB_FIELD_NUMBER: _ClassVar[int]
    ON_FAILURE_FIELD_NUMBER: _ClassVar[int]
    job: str
    on_failure: DependencyPolicy
    def __init__(self, job: _Optional[str] = ..., on_failure: _Optional[_Union[DependencyPolicy, str]] = ...) -> None: ...

class DependencyEdge(_message.Message):
    __slots__ = ("job_id", "type", "status", "on_failure", "resolved_state")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ON_FAILURE_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_STATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    type: str
    status: JobStatus
    on_failure: DependencyPolicy
    resolved_state: str
    def __init__(self, job_id: _Optional[str] = ..., type: _Optional[str] = ..., status: _Optional[_Union[JobStatus, str]] = ..., on_failure: _Optional[_Union[DependencyPolicy, str]] = ..., resolved_state: _Optional[str] = ...) -> None: ...

class DependencyResult(_message.Message):
    __slots__ = ("job_id", "type", "state", "result", "truncated")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    type: str
    state: str
    result: bytes
    truncated: bool
    def __init__(self, job_id: _Optional[str] = ..., type: _Optional[str] = ..., state: _Optional[str] = ..., result: _Optional[bytes] = ..., truncated: _Optional[bool] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt", "worker_id", "started_at_ms", "finished_at_ms", "outcome", "error", "traceback")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    worker_id: str
    started_at_ms: int
    finished_at_ms: int
    outcome: AttemptOutcome
    error: str
    traceback: str
    def __init__(self, attempt: _Optional[int] = ..., worker_id: _Optional[str] = ..., started_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., outcome: _Optional[_Union[AttemptOutcome, str]] = ..., error: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("type", "payload", "priority", "run_at_ms", "delay_ms", "max_attempts", "lease_ttl_ms", "idempotency_key", "concurrency_key", "headers", "depends_on", "ref", "blocks")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    type: str
    payload: bytes
    priority: Priority
    run_at_ms: int
    delay_ms: int
    max_attempts: int
    lease_ttl_ms: int
    idempotency_key: str
    concurrency_key: str
    headers: _containers.ScalarMap[str, str]
    depends_on: _containers.RepeatedCompositeFieldContainer[Dependency]
    ref: str
    blocks: _containers.RepeatedCompositeFieldContainer[Dependency]
    def __init__(self, type: _Optional[str] = ..., payload: _Optional[bytes] = ..., priority: _Optional[_Union[Priority, str]] = ..., run_at_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ..., max_attempts: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., concurrency_key: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., depends_on: _Optional[_Iterable[_Union[Dependency, _Mapping]]] = ..., ref: _Optional[str] = ..., blocks: _Optional[_Iterable[_Union[Dependency, _Mapping]]] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: JobSpec
    def __init__(self, job: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ("job_id", "created")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    created: bool
    def __init__(self, job_id: _Optional[str] = ..., created: _Optional[bool] = ...) -> None: ...

class EnqueueStreamRequest(_message.Message):
    __slots__ = ("seq", "job")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    seq: int
    job: JobSpec
    def __init__(self, seq: _Optional[int] = ..., job: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class EnqueueStreamResponse(_message.Message):
    __slots__ = ("seq", "job_id", "created", "error_code", "error_message", "closed")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    job_id: str
    created: bool
    error_code: int
    error_message: str
    closed: bool
    def __init__(self, seq: _Optional[int] = ..., job_id: _Optional[str] = ..., created: _Optional[bool] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., closed: _Optional[bool] = ...) -> None: ...

class EnqueueManyRequest(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobSpec]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobSpec, _Mapping]]] = ...) -> None: ...

class EnqueueManyResponse(_message.Message):
    __slots__ = ("job_ids", "created")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    created: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ..., created: _Optional[_Iterable[bool]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "type", "priority", "status", "payload", "run_at_ms", "lease_until_ms", "attempts", "failures", "expirations", "max_attempts", "last_error", "dead_reason", "idempotency_key", "enqueued_at_ms", "started_at_ms", "finished_at_ms", "result", "shard", "schedule", "concurrency_key", "rate_limited", "headers", "truncated", "attempt_history", "progress", "worker_id", "dependencies", "dependents", "dependencies_remaining")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    EXPIRATIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    DEAD_REASON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITED_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_HISTORY_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    DEPENDENTS_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_REMAINING_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: str
    priority: Priority
    status: JobStatus
    payload: bytes
    run_at_ms: int
    lease_until_ms: int
    attempts: int
    failures: int
    expirations: int
    max_attempts: int
    last_error: str
    dead_reason: DeadReason
    idempotency_key: str
    enqueued_at_ms: int
    started_at_ms: int
    finished_at_ms: int
    result: bytes
    shard: int
    schedule: str
    concurrency_key: str
    rate_limited: int
    headers: _containers.ScalarMap[str, str]
    truncated: bool
    attempt_history: _containers.RepeatedCompositeFieldContainer[Attempt]
    progress: str
    worker_id: str
    dependencies: _containers.RepeatedCompositeFieldContainer[DependencyEdge]
    dependents: _containers.RepeatedCompositeFieldContainer[DependencyEdge]
    dependencies_remaining: int
    def __init__(self, id: _Optional[str] = ..., type: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., status: _Optional[_Union[JobStatus, str]] = ..., payload: _Optional[bytes] = ..., run_at_ms: _Optional[int] = ..., lease_until_ms: _Optional[int] = ..., attempts: _Optional[int] = ..., failures: _Optional[int] = ..., expirations: _Optional[int] = ..., max_attempts: _Optional[int] = ..., last_error: _Optional[str] = ..., dead_reason: _Optional[_Union[DeadReason, str]] = ..., idempotency_key: _Optional[str] = ..., enqueued_at_ms: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., result: _Optional[bytes] = ..., shard: _Optional[int] = ..., schedule: _Optional[str] = ..., concurrency_key: _Optional[str] = ..., rate_limited: _Optional[int] = ..., headers: _Optional[_Mapping[str, str]] = ..., truncated: _Optional[bool] = ..., attempt_history: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., progress: _Optional[str] = ..., worker_id: _Optional[str] = ..., dependencies: _Optional[_Iterable[_Union[DependencyEdge, _Mapping]]] = ..., dependents: _Optional[_Iterable[_Union[DependencyEdge, _Mapping]]] = ..., dependencies_remaining: _Optional[int] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: JobStatus
    def __init__(self, status: _Optional[_Union[JobStatus, str]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("counters_only",)
    COUNTERS_ONLY_FIELD_NUMBER: _ClassVar[int]
    counters_only: bool
    def __init__(self, counters_only: _Optional[bool] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("type", "priority", "delayed", "ready", "leased", "dead", "oldest_ready_age_ms")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    OLDEST_READY_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    type: str
    priority: Priority
    delayed: int
    ready: int
    leased: int
    dead: int
    oldest_ready_age_ms: int
    def __init__(self, type: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., delayed: _Optional[int] = ..., ready: _Optional[int] = ..., leased: _Optional[int] = ..., dead: _Optional[int] = ..., oldest_ready_age_ms: _Optional[int] = ...) -> None: ...

class ScheduleStats(_message.Message):
    __slots__ = ("name", "type", "materialized", "skipped", "next_occurrence_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MATERIALIZED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    NEXT_OCCURRENCE_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    materialized: int
    skipped: int
    next_occurrence_ms: int
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., materialized: _Optional[int] = ..., skipped: _Optional[int] = ..., next_occurrence_ms: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("queues", "schedules", "dispatcher_id", "sampled_at_ms", "started_at_ms", "counters", "enqueue_to_start")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    DISPATCHER_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_TO_START_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    schedules: _containers.RepeatedCompositeFieldContainer[ScheduleStats]
    dispatcher_id: str
    sampled_at_ms: int
    started_at_ms: int
    counters: _containers.RepeatedCompositeFieldContainer[TypeCounters]
    enqueue_to_start: LatencyHistogram
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ..., schedules: _Optional[_Iterable[_Union[ScheduleStats, _Mapping]]] = ..., dispatcher_id: _Optional[str] = ..., sampled_at_ms: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., counters: _Optional[_Iterable[_Union[TypeCounters, _Mapping]]] = ..., enqueue_to_start: _Optional[_Union[LatencyHistogram, _Mapping]] = ...) -> None: ...

class TypeCounters(_message.Message):
    __slots__ = ("type", "enqueued", "started", "succeeded", "failed", "dead_lettered")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    type: str
    enqueued: int
    started: int
    succeeded: int
    failed: int
    dead_lettered: int
    def __init__(self, type: _Optional[str] = ..., enqueued: _Optional[int] = ..., started: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., dead_lettered: _Optional[int] = ...) -> None: ...

class LatencyHistogram(_message.Message):
    __slots__ = ("bounds_s", "counts")
    BOUNDS_S_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    bounds_s: _containers.RepeatedScalarFieldContainer[float]
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, bounds_s: _Optional[_Iterable[float]] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class DeadFilter(_message.Message):
    __slots__ = ("type", "reason")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    type: str
    reason: DeadReason
    def __init__(self, type: _Optional[str] = ..., reason: _Optional[_Union[DeadReason, str]] = ...) -> None: ...

class ListDeadRequest(_message.Message):
    __slots__ = ("filter", "limit", "after_id")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    filter: DeadFilter
    limit: int
    after_id: str
    def __init__(self, filter: _Optional[_Union[DeadFilter, _Mapping]] = ..., limit: _Optional[int] = ..., after_id: _Optional[str] = ...) -> None: ...

class ListDeadResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class RequeueDeadRequest(_message.Message):
    __slots__ = ("job_ids", "all", "filter")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    filter: DeadFilter
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ..., filter: _Optional[_Union[DeadFilter, _Mapping]] = ...) -> None: ...

class RequeueDeadResponse(_message.Message):
    __slots__ = ("requeued",)
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    requeued: int
    def __init__(self, requeued: _Optional[int] = ...) -> None: ...

class PurgeDeadRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: DeadFilter
    def __init__(self, filter: _Optional[_Union[DeadFilter, _Mapping]] = ...) -> None: ...

class PurgeDeadResponse(_message.Message):
    __slots__ = ("purged",)
    PURGED_FIELD_NUMBER: _ClassVar[int]
    purged: int
    def __init__(self, purged: _Optional[int] = ...) -> None: ...

class PruneJobsRequest(_message.Message):
    __slots__ = ("older_than_s", "type", "statuses", "dry_run", "limit")
    OLDER_THAN_S_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    older_than_s: int
    type: str
    statuses: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    limit: int
    def __init__(self, older_than_s: _Optional[int] = ..., type: _Optional[str] = ..., statuses: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ..., limit: _Optional[int] = ...) -> None: ...

class PruneJobsResponse(_message.Message):
    __slots__ = ("rows", "more")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    rows: int
    more: bool
    def __init__(self, rows: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job", "final")
    JOB_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    job: Job
    final: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., final: _Optional[bool] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetVersionResponse(_message.Message):
    __slots__ = ("version", "protocol", "shard_count")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    version: str
    protocol: int
    shard_count: int
    def __init__(self, version: _Optional[str] = ..., protocol: _Optional[int] = ..., shard_count: _Optional[int] = ...) -> None: ...

class PayloadMatch(_message.Message):
    __slots__ = ("path", "value_json")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    path: str
    value_json: str
    def __init__(self, path: _Optional[str] = ..., value_json: _Optional[str] = ...) -> None: ...

class JobFilter(_message.Message):
    __slots__ = ("types", "type_patterns", "statuses", "priorities", "created_after_ms", "created_before_ms", "finished_after_ms", "finished_before_ms", "idempotency_key", "schedule", "error_contains", "payload", "dead_reason")
    TYPES_FIELD_NUMBER: _ClassVar[int]
    TYPE_PATTERNS_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CONTAINS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DEAD_REASON_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedScalarFieldContainer[str]
    type_patterns: _containers.RepeatedScalarFieldContainer[str]
    statuses: _containers.RepeatedScalarFieldContainer[JobStatus]
    priorities: _containers.RepeatedScalarFieldContainer[Priority]
    created_after_ms: int
    created_before_ms: int
    finished_after_ms: int
    finished_before_ms: int
    idempotency_key: str
    schedule: str
    error_contains: str
    payload: _containers.RepeatedCompositeFieldContainer[PayloadMatch]
    dead_reason: DeadReason
    def __init__(self, types: _Optional[_Iterable[str]] = ..., type_patterns: _Optional[_Iterable[str]] = ..., statuses: _Optional[_Iterable[_Union[JobStatus, str]]] = ..., priorities: _Optional[_Iterable[_Union[Priority, str]]] = ..., created_after_ms: _Optional[int] = ..., created_before_ms: _Optional[int] = ..., finished_after_ms: _Optional[int] = ..., finished_before_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., schedule: _Optional[str] = ..., error_contains: _Optional[str] = ..., payload: _Optional[_Iterable[_Union[PayloadMatch, _Mapping]]] = ..., dead_reason: _Optional[_Union[DeadReason, str]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("filter", "limit", "cursor", "oldest_first", "max_payload_bytes", "with_total")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    OLDEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    WITH_TOTAL_FIELD_NUMBER: _ClassVar[int]
    filter: JobFilter
    limit: int
    cursor: str
    oldest_first: bool
    max_payload_bytes: int
    with_total: bool
    def __init__(self, filter: _Optional[_Union[JobFilter, _Mapping]] = ..., limit: _Optional[int] = ..., cursor: _Optional[str] = ..., oldest_first: _Optional[bool] = ..., max_payload_bytes: _Optional[int] = ..., with_total: _Optional[bool] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_cursor", "total", "total_exact")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    TOTAL_EXACT_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_cursor: str
    total: int
    total_exact: bool
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_cursor: _Optional[str] = ..., total: _Optional[int] = ..., total_exact: _Optional[bool] = ...) -> None: ...

class BulkJobsRequest(_message.Message):
    __slots__ = ("action", "filter", "dry_run", "limit", "after_id")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    action: BulkAction
    filter: JobFilter
    dry_run: bool
    limit: int
    after_id: str
    def __init__(self, action: _Optional[_Union[BulkAction, str]] = ..., filter: _Optional[_Union[JobFilter, _Mapping]] = ..., dry_run: _Optional[bool] = ..., limit: _Optional[int] = ..., after_id: _Optional[str] = ...) -> None: ...

class BulkJobsResponse(_message.Message):
    __slots__ = ("matched", "touched", "more", "last_id")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    TOUCHED_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    matched: int
    touched: int
    more: bool
    last_id: str
    def __init__(self, matched: _Optional[int] = ..., touched: _Optional[int] = ..., more: _Optional[bool] = ..., last_id: _Optional[str] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("name", "role", "types", "auth")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    types: _containers.RepeatedScalarFieldContainer[str]
    auth: bool
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., types: _Optional[_Iterable[str]] = ..., auth: _Optional[bool] = ...) -> None: ...

class LeaseRef(_message.Message):
    __slots__ = ("job_id", "token", "shard")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    token: str
    shard: int
    def __init__(self, job_id: _Optional[str] = ..., token: _Optional[str] = ..., shard: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_id", "job_types", "concurrency", "held")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPES_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    job_types: _containers.RepeatedScalarFieldContainer[str]
    concurrency: int
    held: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    def __init__(self, worker_id: _Optional[str] = ..., job_types: _Optional[_Iterable[str]] = ..., concurrency: _Optional[int] = ..., held: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ...) -> None: ...

class Credit(_message.Message):
    __slots__ = ("slots",)
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    slots: int
    def __init__(self, slots: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    def __init__(self, leases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("lease", "result")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    result: bytes
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., result: _Optional[bytes] = ...) -> None: ...

class Acks(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[Ack]
    def __init__(self, acks: _Optional[_Iterable[_Union[Ack, _Mapping]]] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("lease", "error", "retryable", "retry_delay_ms", "no_handler", "rate_limited", "hold_siblings")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    NO_HANDLER_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITED_FIELD_NUMBER: _ClassVar[int]
    HOLD_SIBLINGS_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    error: str
    retryable: bool
    retry_delay_ms: int
    no_handler: bool
    rate_limited: bool
    hold_siblings: bool
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., error: _Optional[str] = ..., retryable: _Optional[bool] = ..., retry_delay_ms: _Optional[int] = ..., no_handler: _Optional[bool] = ..., rate_limited: _Optional[bool] = ..., hold_siblings: _Optional[bool] = ...) -> None: ...

class Nacks(_message.Message):
    __slots__ = ("nacks",)
    NACKS_FIELD_NUMBER: _ClassVar[int]
    nacks: _containers.RepeatedCompositeFieldContainer[Nack]
    def __init__(self, nacks: _Optional[_Iterable[_Union[Nack, _Mapping]]] = ...) -> None: ...

class JobProgress(_message.Message):
    __slots__ = ("lease", "progress")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    progress: str
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., progress: _Optional[str] = ...) -> None: ...

class ProgressReports(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[JobProgress]
    def __init__(self, reports: _Optional[_Iterable[_Union[JobProgress, _Mapping]]] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "credit", "heartbeat", "acks", "nacks", "drain", "progress", "then_credit")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    THEN_CREDIT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    credit: Credit
    heartbeat: Heartbeat
    acks: Acks
    nacks: Nacks
    drain: Drain
    progress: ProgressReports
    then_credit: int
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., acks: _Optional[_Union[Acks, _Mapping]] = ..., nacks: _Optional[_Union[Nacks, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., progress: _Optional[_Union[ProgressReports, _Mapping]] = ..., then_credit: _Optional[int] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("ref", "type", "payload", "priority", "attempt", "max_attempts", "deadline_ms", "lease_ttl_ms", "idempotency_key", "run_at_ms", "enqueued_at_ms", "concurrency_key", "headers", "dependency_results")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REF_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCY_RESULTS_FIELD_NUMBER: _ClassVar[int]
    ref: LeaseRef
    type: str
    payload: bytes
    priority: Priority
    attempt: int
    max_attempts: int
    deadline_ms: int
    lease_ttl_ms: int
    idempotency_key: str
    run_at_ms: int
    enqueued_at_ms: int
    concurrency_key: str
    headers: _containers.ScalarMap[str, str]
    dependency_results: _containers.RepeatedCompositeFieldContainer[DependencyResult]
    def __init__(self, ref: _Optional[_Union[LeaseRef, _Mapping]] = ..., type: _Optional[str] = ..., payload: _Optional[bytes] = ..., priority: _Optional[_Union[Priority, str]] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., run_at_ms: _Optional[int] = ..., enqueued_at_ms: _Optional[int] = ..., concurrency_key: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., dependency_results: _Optional[_Iterable[_Union[DependencyResult, _Mapping]]] = ...) -> None: ...

class Leases(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ...) -> None: ...

class LeaseExtended(_message.Message):
    __slots__ = ("ref", "deadline_ms")
    REF_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    ref: LeaseRef
    deadline_ms: int
    def __init__(self, ref: _Optional[_Union[LeaseRef, _Mapping]] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class LeasesExtended(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseExtended]
    def __init__(self, leases: _Optional[_Iterable[_Union[LeaseExtended, _Mapping]]] = ...) -> None: ...

class LeaseRejected(_message.Message):
    __slots__ = ("ref", "reason")
    REF_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ref: LeaseRef
    reason: str
    def __init__(self, ref: _Optional[_Union[LeaseRef, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class LeasesRejected(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRejected]
    def __init__(self, leases: _Optional[_Iterable[_Union[LeaseRejected, _Mapping]]] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: LeaseRef
    def __init__(self, ref: _Optional[_Union[LeaseRef, _Mapping]] = ...) -> None: ...

class Redirect(_message.Message):
    __slots__ = ("target", "reason")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    target: str
    reason: str
    def __init__(self, target: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("dispatcher_id", "protocol", "heartbeat_interval_ms")
    DISPATCHER_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    dispatcher_id: str
    protocol: int
    heartbeat_interval_ms: int
    def __init__(self, dispatcher_id: _Optional[str] = ..., protocol: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ...) -> None: ...

class DispatcherMessage(_message.Message):
    __slots__ = ("welcome", "leases", "extended", "rejected", "cancel", "redirect")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    EXTENDED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    leases: Leases
    extended: LeasesExtended
    rejected: LeasesRejected
    cancel: Cancel
    redirect: Redirect
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., leases: _Optional[_Union[Leases, _Mapping]] = ..., extended: _Optional[_Union[LeasesExtended, _Mapping]] = ..., rejected: _Optional[_Union[LeasesRejected, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConnectedWorker(_message.Message):
    __slots__ = ("worker_id", "job_types", "concurrency", "in_flight", "connected_at_ms", "last_seen_ms", "peer", "draining")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPES_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    job_types: _containers.RepeatedScalarFieldContainer[str]
    concurrency: int
    in_flight: int
    connected_at_ms: int
    last_seen_ms: int
    peer: str
    draining: bool
    def __init__(self, worker_id: _Optional[str] = ..., job_types: _Optional[_Iterable[str]] = ..., concurrency: _Optional[int] = ..., in_flight: _Optional[int] = ..., connected_at_ms: _Optional[int] = ..., last_seen_ms: _Optional[int] = ..., peer: _Optional[str] = ..., draining: _Optional[bool] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("dispatcher_id", "workers")
    DISPATCHER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    dispatcher_id: str
    workers: _containers.RepeatedCompositeFieldContainer[ConnectedWorker]
    def __init__(self, dispatcher_id: _Optional[str] = ..., workers: _Optional[_Iterable[_Union[ConnectedWorker, _Mapping]]] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "address", "alive")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    alive: bool
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., alive: _Optional[bool] = ...) -> None: ...

class ShardInfo(_message.Message):
    __slots__ = ("shard", "owner", "epoch", "address", "pending", "assigned")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    shard: int
    owner: str
    epoch: int
    address: str
    pending: int
    assigned: str
    def __init__(self, shard: _Optional[int] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., address: _Optional[str] = ..., pending: _Optional[int] = ..., assigned: _Optional[str] = ...) -> None: ...

class GetShardMapRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetShardMapResponse(_message.Message):
    __slots__ = ("shard_count", "members", "shards")
    SHARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shard_count: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    def __init__(self, shard_count: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ...) -> None: ...

class RebalanceRequest(_message.Message):
    __slots__ = ("dry_run",)
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    def __init__(self, dry_run: _Optional[bool] = ...) -> None: ...

class ShardMove(_message.Message):
    __slots__ = ("shard", "source", "target", "pending")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    shard: int
    source: str
    target: str
    pending: int
    def __init__(self, shard: _Optional[int] = ..., source: _Optional[str] = ..., target: _Optional[str] = ..., pending: _Optional[int] = ...) -> None: ...

class RebalanceResponse(_message.Message):
    __slots__ = ("moves", "applied")
    MOVES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[ShardMove]
    applied: bool
    def __init__(self, moves: _Optional[_Iterable[_Union[ShardMove, _Mapping]]] = ..., applied: _Optional[bool] = ...) -> None: ...

class PushedJob(_message.Message):
    __slots__ = ("id", "record", "payload")
    ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    id: str
    record: bytes
    payload: bytes
    def __init__(self, id: _Optional[str] = ..., record: _Optional[bytes] = ..., payload: _Optional[bytes] = ...) -> None: ...

class PushJobsRequest(_message.Message):
    __slots__ = ("shard", "jobs")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    shard: int
    jobs: _containers.RepeatedCompositeFieldContainer[PushedJob]
    def __init__(self, shard: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[PushedJob, _Mapping]]] = ...) -> None: ...

class PushJobsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ScheduleSpec(_message.Message):
    __slots__ = ("name", "cron", "type", "payload", "priority", "timezone", "max_lag_ms", "catch_up", "max_attempts", "lease_ttl_ms", "enabled")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    MAX_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    name: str
    cron: str
    type: str
    payload: bytes
    priority: Priority
    timezone: str
    max_lag_ms: int
    catch_up: CatchUp
    max_attempts: int
    lease_ttl_ms: int
    enabled: bool
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[str] = ..., type: _Optional[str] = ..., payload: _Optional[bytes] = ..., priority: _Optional[_Union[Priority, str]] = ..., timezone: _Optional[str] = ..., max_lag_ms: _Optional[int] = ..., catch_up: _Optional[_Union[CatchUp, str]] = ..., max_attempts: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., enabled: _Optional[bool] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("spec", "enabled", "version", "shard", "last_occurrence_ms", "next_occurrence_ms", "materialized", "skipped", "created_at_ms", "updated_at_ms")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    LAST_OCCURRENCE_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OCCURRENCE_MS_FIELD_NUMBER: _ClassVar[int]
    MATERIALIZED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    spec: ScheduleSpec
    enabled: bool
    version: int
    shard: int
    last_occurrence_ms: int
    next_occurrence_ms: int
    materialized: int
    skipped: int
    created_at_ms: int
    updated_at_ms: int
    def __init__(self, spec: _Optional[_Union[ScheduleSpec, _Mapping]] = ..., enabled: _Optional[bool] = ..., version: _Optional[int] = ..., shard: _Optional[int] = ..., last_occurrence_ms: _Optional[int] = ..., next_occurrence_ms: _Optional[int] = ..., materialized: _Optional[int] = ..., skipped: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., updated_at_ms: _Optional[int] = ...) -> None: ...

class UpsertScheduleRequest(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: ScheduleSpec
    def __init__(self, schedule: _Optional[_Union[ScheduleSpec, _Mapping]] = ...) -> None: ...

class UpsertScheduleResponse(_message.Message):
    __slots__ = ("schedule", "created", "changed")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    created: bool
    changed: bool
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., created: _Optional[bool] = ..., changed: _Optional[bool] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ("type",)
    TYPE_FIELD_NUMBER: _ClassVar[int]
    type: str
    def __init__(self, type: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules",)
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ...) -> None: ...

class ScheduleNameRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class NextOccurrencesRequest(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class NextOccurrencesResponse(_message.Message):
    __slots__ = ("occurrences_ms", "timezone")
    OCCURRENCES_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    occurrences_ms: _containers.RepeatedScalarFieldContainer[int]
    timezone: str
    def __init__(self, occurrences_ms: _Optional[_Iterable[int]] = ..., timezone: _Optional[str] = ...) -> None: ...

class TokenBucket(_message.Message):
    __slots__ = ("per_s", "burst")
    PER_S_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    per_s: float
    burst: int
    def __init__(self, per_s: _Optional[float] = ..., burst: _Optional[int] = ...) -> None: ...

class QueueSettings(_message.Message):
    __slots__ = ("paused", "concurrency", "key_concurrency", "key_concurrency_overrides", "key_weights", "rate", "key_rate", "retain_finished_s", "retain_dead_s")
    class KeyConcurrencyOverridesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class KeyWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    KEY_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    KEY_CONCURRENCY_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    KEY_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    KEY_RATE_FIELD_NUMBER: _ClassVar[int]
    RETAIN_FINISHED_S_FIELD_NUMBER: _ClassVar[int]
    RETAIN_DEAD_S_FIELD_NUMBER: _ClassVar[int]
    paused: _containers.RepeatedScalarFieldContainer[Priority]
    concurrency: int
    key_concurrency: int
    key_concurrency_overrides: _containers.ScalarMap[str, int]
    key_weights: _containers.ScalarMap[str, int]
    rate: TokenBucket
    key_rate: TokenBucket
    retain_finished_s: int
    retain_dead_s: int
    def __init__(self, paused: _Optional[_Iterable[_Union[Priority, str]]] = ..., concurrency: _Optional[int] = ..., key_concurrency: _Optional[int] = ..., key_concurrency_overrides: _Optional[_Mapping[str, int]] = ..., key_weights: _Optional[_Mapping[str, int]] = ..., rate: _Optional[_Union[TokenBucket, _Mapping]] = ..., key_rate: _Optional[_Union[TokenBucket, _Mapping]] = ..., retain_finished_s: _Optional[int] = ..., retain_dead_s: _Optional[int] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("type", "settings", "shard", "delayed", "ready", "running", "keys_running", "keys_at_limit", "updated_at_ms")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KEYS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    KEYS_AT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    type: str
    settings: QueueSettings
    shard: int
    delayed: int
    ready: int
    running: int
    keys_running: int
    keys_at_limit: int
    updated_at_ms: int
    def __init__(self, type: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ..., shard: _Optional[int] = ..., delayed: _Optional[int] = ..., ready: _Optional[int] = ..., running: _Optional[int] = ..., keys_running: _Optional[int] = ..., keys_at_limit: _Optional[int] = ..., updated_at_ms: _Optional[int] = ...) -> None: ...

class SetQueueSettingsRequest(_message.Message):
    __slots__ = ("type", "settings", "fields")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    type: str
    settings: QueueSettings
    fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, type: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ..., fields: _Optional[_Iterable[str]] = ...) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ("type",)
    TYPE_FIELD_NUMBER: _ClassVar[int]
    type: str
    def __init__(self, type: _Optional[str] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ...) -> None: ...

class PauseQueueRequest(_message.Message):
    __slots__ = ("type", "priority")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    type: str
    priority: Priority
    def __init__(self, type: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ...) -> None: ...
