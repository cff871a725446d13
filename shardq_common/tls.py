"""Transport security: the server's TLS credentials, and secure channels (with a bearer token) to it.

The server side reads PEM files named by the settings (``SHARDQ_TLS_CERT``/``_KEY``, and
``SHARDQ_TLS_CLIENT_CA`` for mutual TLS). The client side, :class:`ChannelSecurity`, is shared by the
worker SDK, dispatcherctl and the dispatchers' own channels to each other.

The token travels as ``authorization: Bearer <token>`` metadata on every call rather than as gRPC
call credentials, which gRPC only attaches on TLS channels: so auth can also be used (and tested)
on a plaintext channel, which is only sensible on loopback.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from .errors import ConfigError


def read_pem(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what} {path} is not a PEM file")
    return data


def server_credentials(
    cert: str | None, key: str | None, client_ca: str | None = None
) -> grpc.ServerCredentials | None:
    """TLS with this certificate chain and key; with a client CA, clients must present a
    certificate it signed (mutual TLS). None: plaintext."""
    if not cert and not key:
        if client_ca:
            raise ConfigError("SHARDQ_TLS_CLIENT_CA needs SHARDQ_TLS_CERT and SHARDQ_TLS_KEY")
        return None
    if not (cert and key):
        raise ConfigError("set both SHARDQ_TLS_CERT and SHARDQ_TLS_KEY (a certificate and its key)")
    pair = (read_pem(key, "the TLS key"), read_pem(cert, "the TLS certificate"))
    ca = read_pem(client_ca, "the client CA") if client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


def _flag(value: str | None) -> bool | None:
    if value is None or value == "":
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class ChannelSecurity:
    """How a client reaches a dispatcher: plaintext or TLS, with or without a bearer token.

    ``tls``: use TLS, checking the server against the system roots, or ``ca`` when given (giving a CA
    turns TLS on). ``cert``/``key``: a client certificate for dispatchers that require mutual TLS.
    ``server_name``: the name to check in the server's certificate instead of the address' host (for
    addresses such as pod IPs that the certificate does not name).
    """

    token: str | None = field(default=None, repr=False)
    tls: bool = False
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = field(default=None, repr=False)
    server_name: str | None = None

    @classmethod
    def resolve(
        cls,
        *,
        token: str | None = None,
        tls: bool | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_server_name: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ChannelSecurity:
        """Arguments first, then SHARDQ_TOKEN, SHARDQ_TLS, SHARDQ_TLS_CA, SHARDQ_TLS_CLIENT_CERT,
        SHARDQ_TLS_CLIENT_KEY and SHARDQ_TLS_SERVER_NAME."""
        env = os.environ if env is None else env
        token = token or env.get("SHARDQ_TOKEN") or None
        ca_path = tls_ca or env.get("SHARDQ_TLS_CA") or None
        cert_path = tls_cert or env.get("SHARDQ_TLS_CLIENT_CERT") or None
        key_path = tls_key or env.get("SHARDQ_TLS_CLIENT_KEY") or None
        if bool(cert_path) != bool(key_path):
            raise ConfigError("a client certificate needs its key: give both tls_cert and tls_key")
        if tls is None:
            tls = _flag(env.get("SHARDQ_TLS"))
        use_tls = bool(tls) or bool(ca_path) or bool(cert_path)
        if tls is False and (ca_path or cert_path):
            raise ConfigError("TLS options were given with tls turned off")
        return cls(
            token=token,
            tls=use_tls,
            ca=read_pem(ca_path, "the CA") if ca_path else None,
            cert=read_pem(cert_path, "the client certificate") if cert_path else None,
            key=read_pem(key_path, "the client key") if key_path else None,
            server_name=tls_server_name or env.get("SHARDQ_TLS_SERVER_NAME") or None,
        )

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def _options(self, options: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        if self.tls and self.server_name:
            return [*options, ("grpc.ssl_target_name_override", self.server_name)]
        return options

    def channel(self, target: str, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
        """A blocking channel."""
        opts = self._options(options or [])
        if self.tls:
            return grpc.secure_channel(target, self._credentials(), options=opts)
        return grpc.insecure_channel(target, options=opts)

    def aio_channel(self, target: str, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
        """An asyncio channel."""
        opts = self._options(options or [])
        if self.tls:
            return grpc.aio.secure_channel(target, self._credentials(), options=opts)
        return grpc.aio.insecure_channel(target, options=opts)
