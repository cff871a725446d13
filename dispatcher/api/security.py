"""A dispatcher's security set-up, read once at start: TLS credentials, tokens, and how it reaches peers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from shardq_common.tls import ChannelSecurity, read_pem, server_credentials

from ..config import Settings
from .auth import TokenTable
from .auth_interceptor import AuthInterceptor


@dataclass(frozen=True)
class ServerSecurity:
    #: None: plaintext ports.
    credentials: grpc.ServerCredentials | None
    #: None: no authentication.
    tokens: TokenTable | None
    #: The dispatcher's own channels to the other dispatchers (hand-offs of new jobs).
    peers: ChannelSecurity
    mutual_tls: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerSecurity:
        """Reads every file now, so a missing certificate or a malformed tokens file stops the start
        with a ConfigError naming it."""
        credentials = server_credentials(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
        tokens = TokenTable.load(settings.auth_tokens_file, settings.auth_tokens, settings.peer_token)
        tls = credentials is not None
        mutual = tls and bool(settings.tls_client_ca)
        peers = ChannelSecurity(
            token=settings.peer_token if tokens is not None else None,
            tls=tls,
            ca=read_pem(settings.tls_ca, "the CA (SHARDQ_TLS_CA)") if tls and settings.tls_ca else None,
            # Under mutual TLS a dispatcher shows its own certificate to its peers.
            cert=read_pem(settings.tls_cert, "the TLS certificate") if mutual and settings.tls_cert else None,
            key=read_pem(settings.tls_key, "the TLS key") if mutual and settings.tls_key else None,
            server_name=settings.tls_server_name,
        )
        return cls(credentials, tokens, peers, mutual)

    def interceptors(self) -> list[Any]:
        return [AuthInterceptor(self.tokens)] if self.tokens is not None else []

    def bind(self, server: grpc.aio.Server, address: str) -> int:
        """Listen on ``address`` (TLS when configured); the bound port, 0 when it could not bind."""
        try:
            if self.credentials is not None:
                return server.add_secure_port(address, self.credentials)
            return server.add_insecure_port(address)
        except RuntimeError:  # grpcio raises where older releases returned 0
            return 0

    def describe(self) -> dict[str, Any]:
        """For the start-up log line: what is on, and never a secret."""
        return {
            "tls": self.credentials is not None,
            "mutual_tls": self.mutual_tls,
            "auth": self.tokens is not None,
            "tokens": self.tokens.roles() if self.tokens is not None else {},
        }
