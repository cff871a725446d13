"""SHARDQ_QUEUES_FILE: the rates and tables it takes, and the errors naming the entry it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.queue.flow import ALL_CLASSES, QueueSettings, Rate
from dispatcher.queue.flow_file import check, load
from dispatcher.queue.rates import parse_rate
from dispatcher.queue.states import Priority
from shardq_common.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "per_s"),
    [("100/s", 100.0), ("30/m", 0.5), ("3600/h", 1.0), ("2.5", 2.5), ("none", None), ("", None)],
)
def test_rates(text: str, per_s: float | None) -> None:
    assert parse_rate(text) == per_s


@pytest.mark.parametrize("text", ["fast", "10/d", "-1/s", "nan/s", "inf"])
def test_bad_rates(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


def test_a_file_gives_the_fields_it_names(tmp_path: Path) -> None:
    path = tmp_path / "queues.toml"
    path.write_text(
        '[queues."mail.send"]\nconcurrency = 20\nrate = "600/m"\nburst = 10\n'
        "key_concurrency_overrides = { big = 4 }\n[queues.noop]\npaused = true\n"
    )
    loaded = load(str(path))
    settings, names = loaded["mail.send"]
    assert names == ["concurrency", "key_concurrency_overrides", "rate"]
    assert settings == QueueSettings(
        "mail.send", concurrency=20, key_concurrency_overrides={"big": 4}, rate=Rate(10.0, 10)
    )
    assert loaded["noop"] == (QueueSettings("noop", paused=ALL_CLASSES), ["paused"])


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[queue.noop]\nconcurrency = 1\n", "unknown table"),
        ("[queues.noop]\nspeed = 1\n", "speed"),
        ('[queues."bad type"]\nconcurrency = 1\n', "bad type"),
        ("[queues.noop]\nconcurrency = 1.5\n", "concurrency"),
        ("[queues.noop]\nburst = 5\n", "burst"),
        ('[queues.noop]\npaused = ["urgent"]\n', "paused"),
        ('[queues.noop]\nrate = "fast"\n', "rate"),
        ("[queues.noop]\nconcurrency = -1\n", "concurrency"),
        ("[queues.noop]\nkey_weights = { a = 5000 }\n", "key_weights"),
        ("not toml = [", "not TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_entry(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "queues.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=said):
        check(str(path))


def test_paused_classes(tmp_path: Path) -> None:
    path = tmp_path / "queues.toml"
    path.write_text('[queues.noop]\npaused = ["low", "high"]\n')
    assert load(str(path))["noop"][0].paused == frozenset({Priority.LOW, Priority.HIGH})


def test_a_file_sets_retention_periods_as_durations(tmp_path: Path) -> None:
    path = tmp_path / "queues.toml"
    path.write_text('[queues."mail.send"]\nretain_finished = "3d"\nretain_dead = "default"\n')
    settings, names = load(str(path))["mail.send"]
    assert (settings.retain_finished_s, settings.retain_dead_s) == (3 * 86_400, 0)
    assert sorted(names) == ["retain_dead_s", "retain_finished_s"]
    path.write_text('[queues."mail.send"]\nretain_dead = "10s"\n')
    with pytest.raises(ConfigError, match="retain_dead_s: 10 s is not a retention period"):
        check(str(path))
    path.write_text('[queues."mail.send"]\nretain_dead = "soon"\n')
    with pytest.raises(ConfigError, match="retain_dead: 'soon' is not a duration"):
        load(str(path))
