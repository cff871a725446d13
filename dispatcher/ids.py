"""Job ids: 26 characters, Crockford base32 of 48 bits of milliseconds and 80 random bits (as ULID).

Time-ordered, so DB primary-key inserts stay local and ``ORDER BY id`` is roughly age.
"""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_job_id() -> str:
    value = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)
    out = []
    for _ in range(26):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))
