"""The dashboard's settings: where it listens, which dispatcher it talks to, how sessions are sealed."""

from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass

from shardq_common.errors import ConfigError

DEFAULT_LISTEN = "127.0.0.1:7080"
#: Sessions last this long after sign-in (SHARDQ_DASHBOARD_SESSION_S).
DEFAULT_SESSION_S = 8 * 3600


@dataclass(frozen=True)
class DashboardSettings:
    #: HOST:PORT the HTTP server binds (SHARDQ_DASHBOARD_LISTEN; default 127.0.0.1:7080).
    listen: str = DEFAULT_LISTEN
    #: The dispatcher the dashboard calls (SHARDQ_TARGET); any member of a cluster answers.
    target: str | None = None
    #: Key material the session cookie is sealed with (SHARDQ_DASHBOARD_SECRET, at least 32
    #: characters). Unset: a random key per process, so sessions end when it restarts and replicas
    #: behind one Service must share a secret.
    secret: str = ""
    #: Seconds a session lasts after sign-in.
    session_s: int = DEFAULT_SESSION_S
    #: Set the cookie's Secure flag (SHARDQ_DASHBOARD_SECURE_COOKIES=1: TLS ends at a proxy in front).
    #: None: Secure when the request came over https.
    secure_cookies: bool | None = None
    #: Serve a non-loopback address although the dispatcher checks no tokens (anyone who reaches
    #: the port may then act as admin): SHARDQ_DASHBOARD_ALLOW_OPEN=1 or --allow-open.
    allow_open: bool = False
    #: TLS certificate and key files for serving HTTPS itself (SHARDQ_DASHBOARD_TLS_CERT/_KEY).
    tls_cert: str | None = None
    tls_key: str | None = None
    #: Host header values answered (SHARDQ_DASHBOARD_ALLOWED_HOSTS or --allowed-hosts, comma-separated;
    #: ``*.example.com`` matches subdomains). Unset: on loopback, the listen host, localhost,
    #: 127.0.0.1 and [::1]; on a named address, that address; on a wildcard (0.0.0.0, ::), any.
    #: Other names are refused so that a page whose name was rebound to this address cannot use it.
    allowed_hosts: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, **overrides: object) -> DashboardSettings:
        env = os.environ
        values: dict[str, object] = {
            "listen": env.get("SHARDQ_DASHBOARD_LISTEN") or DEFAULT_LISTEN,
            "target": env.get("SHARDQ_TARGET") or None,
            "secret": env.get("SHARDQ_DASHBOARD_SECRET", ""),
            "session_s": int(env.get("SHARDQ_DASHBOARD_SESSION_S") or DEFAULT_SESSION_S),
            "allow_open": env.get("SHARDQ_DASHBOARD_ALLOW_OPEN", "") in ("1", "true", "yes"),
            "secure_cookies": True
            if env.get("SHARDQ_DASHBOARD_SECURE_COOKIES", "") in ("1", "true", "yes")
            else None,
            "tls_cert": env.get("SHARDQ_DASHBOARD_TLS_CERT") or None,
            "tls_key": env.get("SHARDQ_DASHBOARD_TLS_KEY") or None,
            "allowed_hosts": host_list(env.get("SHARDQ_DASHBOARD_ALLOWED_HOSTS", "")),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)  # type: ignore[arg-type]
        settings.check()
        return settings

    def check(self) -> None:
        host_port(self.listen)
        if self.secret and len(self.secret) < 32:
            raise ConfigError("SHARDQ_DASHBOARD_SECRET: at least 32 characters")
        if not 60 <= self.session_s <= 30 * 86400:
            raise ConfigError("SHARDQ_DASHBOARD_SESSION_S: 60..2592000 seconds")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("SHARDQ_DASHBOARD_TLS_CERT and _KEY go together")
        for pattern in self.allowed_hosts:
            wildcard = pattern.startswith("*") and pattern != "*"
            if "*" in pattern[1:] or (wildcard and not pattern.startswith("*.")):
                raise ConfigError(f"SHARDQ_DASHBOARD_ALLOWED_HOSTS: {pattern!r}: a name, or *.domain")

    def trusted_hosts(self) -> list[str]:
        """The Host header values the dashboard answers (see allowed_hosts)."""
        if self.allowed_hosts:
            return list(self.allowed_hosts)
        host, _ = host_port(self.listen)
        shown = f"[{host}]" if ":" in host else host
        if is_loopback(host):
            return sorted({shown.lower(), "localhost", "127.0.0.1", "[::1]"})
        if host in ("", "0.0.0.0", "::"):
            return ["*"]
        return [shown.lower()]

    def session_key(self) -> str:
        return self.secret or secrets.token_hex(32)


def host_list(text: str | None) -> tuple[str, ...]:
    return tuple(h.strip().lower() for h in (text or "").split(",") if h.strip())


def host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {listen!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
