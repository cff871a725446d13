"""Job ids: 26 characters, Crockford base32 of 48 bits of milliseconds and 80 random bits (as ULID).

Time-ordered, so DB primary-key inserts stay local and ``ORDER BY id`` is roughly age.
"""

from __future__ import annotations

import hashlib
import secrets
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_job_id() -> str:
    return _encode((time.time_ns() // 1_000_000) << 80 | secrets.randbits(80))


def _encode(value: int) -> str:
    out = []
    for _ in range(26):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def occurrence_job_id(schedule: str, version: int, occurrence_ms: int) -> str:
    """The job id of one occurrence of a schedule: the same wherever and however often it is
    computed, so the DB's primary key and Redis's HEXISTS keep an occurrence to one job. Same shape
    as new_job_id: the occurrence time, then 80 bits of a hash of (schedule, version, time)."""
    digest = hashlib.sha256(f"{schedule}\0{version}\0{occurrence_ms}".encode()).digest()
    return _encode(occurrence_ms << 80 | int.from_bytes(digest[:10], "big"))


def time_of(job_id: str) -> int:
    """The milliseconds in a job id: when it was made, or for an occurrence's job, the occurrence."""
    value = 0
    for ch in job_id[:10]:
        value = value * 32 + _ALPHABET.index(ch)
    return value
