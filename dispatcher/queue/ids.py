"""Job ids: 26 characters, Crockford base32 of 48 bits of milliseconds and 80 random bits (as ULID).

Time-ordered, so DB primary-key inserts stay local and ``ORDER BY id`` is roughly age.
"""

from __future__ import annotations

import hashlib
import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Two characters per 10 bits: 13 lookups make the 26 characters (130 bits, the top two zero).
_PAIRS = [_ALPHABET[i >> 5] + _ALPHABET[i & 31] for i in range(1024)]
_SHIFTS = tuple(range(120, -1, -10))
# A random byte's low 5 bits pick a character: 16 random characters are the 80 random bits.
_CHAR_OF_BYTE = bytes(ord(_ALPHABET[b & 31]) for b in range(256))


def new_job_id() -> str:
    return new_job_ids(1)[0]


def new_job_ids(n: int) -> list[str]:
    """n fresh ids (one read of the OS's random source for the whole batch)."""
    return ids_from(time.time_ns() // 1_000_000, os.urandom(16 * n))


def ids_from(millis: int, randomness: bytes) -> list[str]:
    """The ids of one millisecond, 16 random bytes each. They share their first 10 characters (the
    time); each of the other 16 is one byte's low 5 bits, spelled by one C-level translate for all."""
    prefix = _encode(millis << 80)[:10]
    body = randomness.translate(_CHAR_OF_BYTE).decode("ascii")
    return [prefix + body[i : i + 16] for i in range(0, len(body), 16)]


def _encode(value: int) -> str:
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


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
