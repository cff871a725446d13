from __future__ import annotations

import re

import pytest

from dispatcher.config import FairnessPolicy, PartitionPolicy, RetentionPolicy, RetryPolicy, Settings
from shardq_common.errors import ConfigError


def test_defaults_match_the_mission():
    s = Settings()
    assert s.lease_ttl_ms == 60_000 and s.max_attempts == 5
    assert (s.retry.base_ms, s.retry.jitter) == (1000, 0.0)
    assert s.fairness.weights == (6, 3, 1) and not s.fairness.strict
    assert s.max_payload_bytes == 1 << 20 and s.max_batch == 10_000


def test_from_env_reads_shardq_variables():
    env = {
        "SHARDQ_REDIS_URL": "redis://r:6379/0",
        "SHARDQ_SHARD_COUNT": "16",
        "SHARDQ_RETRY_BASE_MS": "250",
        "SHARDQ_PRIORITY_WEIGHTS": "high=8,default=2,low=1",
        "SHARDQ_RECONCILE_INTERVAL_S": "30.5",
    }
    s = Settings.from_env(env)
    assert s.redis_url == "redis://r:6379/0" and s.shard_count == 16 and s.retry.base_ms == 250
    assert s.fairness.weights == (8, 2, 1) and s.reconcile_interval_s == 30.5


def test_overrides_win_over_env():
    assert Settings.from_env({"SHARDQ_LISTEN": "0.0.0.0:1"}, listen="127.0.0.1:2").listen == "127.0.0.1:2"


@pytest.mark.parametrize(
    "env, message",
    [
        ({"SHARDQ_SHARD_COUNT": "zero"}, "not a number"),
        ({"SHARDQ_SHARD_COUNT": "0"}, "shard count"),
        ({"SHARDQ_MAX_ATTEMPTS": "0"}, "max_attempts"),
        ({"SHARDQ_RETRY_JITTER": "2"}, "jitter"),
        ({"SHARDQ_PRIORITY_WEIGHTS": "1,2"}, "three"),
        ({"SHARDQ_PRIORITY_WEIGHTS": "high=x"}, "weights"),
        ({"SHARDQ_PRIORITY_WEIGHTS": "0,1,1"}, ">= 1"),
        ({"SHARDQ_LEASE_AHEAD_MS": "51"}, "lease ahead"),
        ({"SHARDQ_LEASE_AHEAD_MS": "-1"}, "lease ahead"),
    ],
)
def test_bad_settings_are_rejected_with_a_message(env, message):
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_retry_policy_validation():
    with pytest.raises(ConfigError, match="cap"):
        RetryPolicy(base_ms=1000, cap_ms=10)
    assert FairnessPolicy.parse("strict").strict


def test_default_db_is_sqlite_in_the_data_dir():
    assert Settings(data_dir="d").resolved_db_url() == "sqlite:///d/shardq.sqlite3"


def test_secrets_are_redacted_from_urls():
    from dispatcher.store.postgres import redact

    assert redact("postgresql://app:s3cret@db:5432/jobs") == "postgresql://app:***@db:5432/jobs"
    assert redact("redis+cluster://:pw@a:7001,b:7002") == "redis+cluster://:***@a:7001,b:7002"
    assert redact("redis://cache:6379/0") == "redis://cache:6379/0"


def test_retention_settings_are_durations_within_bounds() -> None:
    settings = Settings.from_env({"SHARDQ_RETENTION_SUCCEEDED": "2d", "SHARDQ_RETENTION_INTERVAL": "0"})
    assert settings.retention == RetentionPolicy(succeeded_s=2 * 86_400, interval_s=0)
    assert Settings.from_env({}).retention == RetentionPolicy(succeeded_s=7 * 86_400, dead_s=30 * 86_400)
    for env, message in (
        ({"SHARDQ_RETENTION_DEAD": "3x"}, "SHARDQ_RETENTION_DEAD: '3x' is not a duration"),
        ({"SHARDQ_RETENTION_SUCCEEDED": "30s"}, "SHARDQ_RETENTION_SUCCEEDED: 30 s is not a retention period"),
        ({"SHARDQ_RETENTION_BATCH": "0"}, "SHARDQ_RETENTION_BATCH must be in 1..10000"),
        ({"SHARDQ_RETENTION_BATCH": "many"}, "SHARDQ_RETENTION_BATCH='many' is not a whole number"),
        ({"SHARDQ_RETENTION_INTERVAL": "200ms"}, "SHARDQ_RETENTION_INTERVAL must be 1 s .. 1 d"),
        ({"SHARDQ_RETENTION_PASS_ROWS": "10"}, "SHARDQ_RETENTION_PASS_ROWS must be at least"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            Settings.from_env(env)


def test_partition_settings_are_checked() -> None:
    settings = Settings.from_env(
        {
            "SHARDQ_PARTITION_INTERVAL": "6h",
            "SHARDQ_PARTITIONS_AHEAD": "8",
            "SHARDQ_PARTITION_CHECK_INTERVAL": "1m",
        }
    )
    assert settings.partitions == PartitionPolicy(interval_s=6 * 3600, ahead=8, check_s=60.0)
    assert Settings.from_env({}).partitions == PartitionPolicy(interval_s=86_400, ahead=3)
    for env, message in (
        ({"SHARDQ_PARTITION_INTERVAL": "10m"}, "SHARDQ_PARTITION_INTERVAL must be 1h .. 7d"),
        ({"SHARDQ_PARTITION_INTERVAL": "daily"}, "SHARDQ_PARTITION_INTERVAL: 'daily' is not a duration"),
        ({"SHARDQ_PARTITIONS_AHEAD": "0"}, "SHARDQ_PARTITIONS_AHEAD must be in 1..366"),
        ({"SHARDQ_PARTITIONS_AHEAD": "some"}, "SHARDQ_PARTITIONS_AHEAD='some' is not a whole number"),
        ({"SHARDQ_PARTITION_MAX_KEPT_SHARE": "0"}, "SHARDQ_PARTITION_MAX_KEPT_SHARE must be in (0, 1]"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            Settings.from_env(env)
