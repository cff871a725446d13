"""shardmap.shard_for: CRC-32 (zlib/IEEE) of the type's UTF-8 bytes modulo the shard count."""

from __future__ import annotations

import binascii
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardmap import DEFAULT_SHARD_COUNT, MAX_SHARD_COUNT, shard_for

job_types = st.text(max_size=200)
shard_counts = st.integers(min_value=1, max_value=MAX_SHARD_COUNT)


def crc32_shard(job_type: str, shard_count: int) -> int:
    """The documented mapping, computed with binascii rather than zlib."""
    return binascii.crc32(job_type.encode("utf-8")) % shard_count


def test_limits() -> None:
    assert MAX_SHARD_COUNT == 16384
    assert 1 <= DEFAULT_SHARD_COUNT <= MAX_SHARD_COUNT


@given(job_types, shard_counts)
def test_in_range(job_type: str, shard_count: int) -> None:
    assert 0 <= shard_for(job_type, shard_count) < shard_count


@given(job_types, shard_counts)
def test_deterministic(job_type: str, shard_count: int) -> None:
    assert shard_for(job_type, shard_count) == shard_for(job_type, shard_count)


@given(job_types, shard_counts)
def test_is_crc32_modulo_shard_count(job_type: str, shard_count: int) -> None:
    assert shard_for(job_type, shard_count) == crc32_shard(job_type, shard_count)


@given(job_types, st.integers(min_value=0, max_value=14))
def test_power_of_two_counts_nest(job_type: str, bits: int) -> None:
    # With S a power of two, the shard for S is the shard for 16384 modulo S.
    assert shard_for(job_type, 1 << bits) == shard_for(job_type, MAX_SHARD_COUNT) % (1 << bits)


@pytest.mark.parametrize(
    ("job_type", "crc"),
    [
        ("", 0x00000000),
        ("123456789", 0xCBF43926),  # the CRC-32/ISO-HDLC check value
        ("a", 0xE8B7BE43),
        ("email.send", binascii.crc32(b"email.send")),
        ("r\u00e9sum\u00e9.render", binascii.crc32("r\u00e9sum\u00e9.render".encode())),
        ("\u65e5\u672c", binascii.crc32("\u65e5\u672c".encode())),
    ],
)
@pytest.mark.parametrize("shard_count", [1, 7, DEFAULT_SHARD_COUNT, 1000, MAX_SHARD_COUNT])
def test_known_values(job_type: str, crc: int, shard_count: int) -> None:
    assert binascii.crc32(job_type.encode("utf-8")) == crc
    assert shard_for(job_type, shard_count) == crc % shard_count


def test_same_in_another_process() -> None:
    """No dependence on hash randomization or process state."""
    names = ["", "a", "email.send", "report.build", "r\u00e9sum\u00e9", "\u65e5\u672c"]
    code = (
        "import json, sys; from shardmap import shard_for; "
        "print(json.dumps([shard_for(n, c) for n in json.loads(sys.argv[1]) for c in (7, 64, 16384)]))"
    )
    expected = [shard_for(n, c) for n in names for c in (7, 64, 16384)]
    for seed in ("0", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(names)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        assert json.loads(out) == expected


@pytest.mark.parametrize("shard_count", [0, -1, MAX_SHARD_COUNT + 1, 1 << 20])
def test_rejects_bad_shard_count(shard_count: int) -> None:
    with pytest.raises(ValueError, match="shard_count"):
        shard_for("email.send", shard_count)


@given(job_types, st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_SHARD_COUNT + 1)))
def test_rejects_any_out_of_range_count(job_type: str, shard_count: int) -> None:
    with pytest.raises(ValueError):
        shard_for(job_type, shard_count)
