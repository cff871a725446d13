"""Session cookies: the signed-in token, who it is and a CSRF token, sealed with AES-GCM.

The cookie carries the user's dispatcher token (so that any replica sharing the secret can serve the
session, and nothing is kept server-side), hence it is encrypted, not only signed: AES-GCM gives
both secrecy and integrity, and the expiry inside is checked on every request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

COOKIE = "shardq_session"
#: The sign-in form's own cookie (its CSRF token): showing the form leaves a session alone.
SIGNIN_COOKIE = "shardq_signin"
#: Cookies bigger than this are refused unread (a browser keeps 4 KiB per cookie anyway).
MAX_COOKIE_CHARS = 4096
_AAD = b"shardq-dashboard-session-v1"


@dataclass(frozen=True)
class Session:
    #: The dispatcher token the user signed in with; "" with auth off.
    token: str
    name: str
    role: str
    types: tuple[str, ...]
    #: Unix seconds after which the session is over.
    expires: float
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    @property
    def may_act(self) -> bool:
        return self.role == "admin"

    @property
    def signed_in(self) -> bool:
        return bool(self.name)

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires


class Sealer:
    def __init__(self, secret: str) -> None:
        self._aead = AESGCM(hashlib.sha256(secret.encode()).digest())

    def seal(self, session: Session) -> str:
        nonce = os.urandom(12)
        data = json.dumps(asdict(session), separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(nonce + self._aead.encrypt(nonce, data, _AAD)).decode()

    def open(self, cookie: str | None) -> Session | None:
        """The session, or None when the cookie is missing, forged, altered or expired."""
        if not cookie or len(cookie) > MAX_COOKIE_CHARS:
            return None
        try:
            raw = base64.urlsafe_b64decode(cookie.encode())
            data = json.loads(self._aead.decrypt(raw[:12], raw[12:], _AAD))
            session = Session(**{**data, "types": tuple(data["types"])})
        except (ValueError, TypeError, KeyError, InvalidTag):
            return None
        return None if session.expired() else session


def same_token(given: str | None, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(str(given).encode(), expected.encode())
