"""Secrets out of logs and error messages: passwords in URLs, password query options, bearer tokens."""

from __future__ import annotations

import re

MASK = "***"
# scheme://user:password@ (also a bare :password@, as in redis://:secret@host); anywhere in a text.
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^:/@\s]*):[^@/\s]*@", re.I)
# ?password=... / &sslpassword=... (psycopg and redis-py take these as URL query options).
_QUERY_PASSWORD = re.compile(r"([?&;\s](?:ssl)?password=)[^&\s]*", re.I)
# A token as sent in gRPC metadata.
_BEARER = re.compile(r"(bearer\s+)\S+", re.I)


def redact(text: str) -> str:
    """``text`` with every URL password, password option and bearer token replaced by ``***``."""
    text = _URL_PASSWORD.sub(rf"\1:{MASK}@", text)
    text = _QUERY_PASSWORD.sub(rf"\1{MASK}", text)
    return _BEARER.sub(rf"\1{MASK}", text)


class SecretFilter:
    """Masks known secret values (tokens read at start) wherever they appear in a text."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()

    def add(self, secret: str) -> None:
        if len(secret) >= 8:  # shorter strings would mask ordinary words; tokens are longer anyway
            self._secrets.add(secret)

    def __call__(self, text: str) -> str:
        text = redact(text)
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text


#: The process-wide filter the log processor applies (see logs.py); auth registers its tokens here.
SECRETS = SecretFilter()
