"""The worker SDK writes its results and heartbeats in messages within the dispatcher's limits, and the
limits' settings are consistent."""

from __future__ import annotations

import pytest

from dispatcher.config import Settings
from shardq_common.errors import ConfigError
from shardq_common.pb import shardq_pb2 as pb
from worker_sdk._worker import MAX_RESULT_BYTES, MESSAGE_BYTES, MESSAGE_LEASES, _parts


def test_heartbeats_and_results_are_split_within_the_dispatchers_limits() -> None:
    limits = Settings()
    assert MESSAGE_LEASES <= limits.max_lease_refs and MESSAGE_BYTES < limits.max_request_bytes
    refs = [pb.LeaseRef(job_id=f"job-{i}", token="t", shard=1) for i in range(2_500)]
    parts = list(_parts(refs))
    assert [len(p) for p in parts] == [1000, 1000, 500]
    assert [r for p in parts for r in p] == refs  # all of them, in order

    acks = [pb.Ack(lease=refs[i], result=b"r" * MAX_RESULT_BYTES) for i in range(300)]
    parts = list(_parts(acks))
    assert [a for p in parts for a in p] == acks
    for part in parts:
        assert pb.WorkerMessage(acks=pb.Acks(acks=part)).ByteSize() <= MESSAGE_BYTES + 8 * len(part)


def test_the_request_limit_leaves_room_for_a_job_of_the_largest_payload() -> None:
    env = {"SHARDQ_MAX_PAYLOAD_BYTES": str(4 << 20), "SHARDQ_MAX_REQUEST_BYTES": str(4 << 20)}
    with pytest.raises(ConfigError, match="max_request_bytes"):
        Settings.from_env(env)
    assert Settings.from_env({**env, "SHARDQ_MAX_REQUEST_BYTES": str(5 << 20)}).max_request_bytes == 5 << 20
    with pytest.raises(ConfigError, match="max_lease_refs"):
        Settings.from_env({"SHARDQ_MAX_LEASE_REFS": "0"})
