"""Which Redis errors are outages (retry later: UNAVAILABLE) and which are not (INTERNAL)."""

from __future__ import annotations

import pytest
from redis import exceptions as rex

from dispatcher.ops.redis_client import ClusterUnavailable, ReadOnlyReplica
from dispatcher.ops.redis_errors import redis_error_kind, redis_transient


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (rex.ConnectionError("Connection refused"), "connection"),
        (ConnectionResetError(), "connection"),
        (rex.TimeoutError("Timeout reading from socket"), "timeout"),
        (rex.BusyLoadingError("Redis is loading the dataset in memory"), "loading"),
        (rex.ReadOnlyError("You can't write against a read only replica."), "readonly"),
        (ReadOnlyReplica("the Redis server is a read-only replica now"), "readonly"),
        (rex.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "oom"),
        (rex.ResponseError("MISCONF Redis is configured to save RDB snapshots, but..."), "misconf"),
        (rex.ResponseError("NOREPLICAS Not enough good replicas to write."), "noreplicas"),
        (rex.ResponseError("BUSY Redis is busy running a script."), "busy"),
        (rex.MasterDownError("Link with MASTER is down"), "masterdown"),
        (rex.TryAgainError("Multiple keys request during rehashing of slot"), "tryagain"),
        (ClusterUnavailable("Redis Cluster unavailable: ..."), "clusterdown"),
        (rex.NoScriptError("No matching script. Please use EVAL."), "noscript"),
    ],
)
def test_outages_are_transient(error: BaseException, kind: str) -> None:
    assert redis_error_kind(error) == kind
    assert redis_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        rex.ResponseError("Unknown Redis command called from script script: 1996..., on @user_script:1."),
        rex.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        rex.ResponseError("BUSYKEY Target key name already exists."),
        rex.NoPermissionError("this user has no permissions to run the 'info' command"),
        rex.DataError("Invalid input of type: 'NoneType'."),
    ],
)
def test_error_replies_that_are_no_outage_are_not_transient(error: BaseException) -> None:
    assert redis_error_kind(error) == "other"
    assert not redis_transient(error)
