"""Helpers for the dashboard's tests: a TestClient on the app, and reading its pages' CSRF token."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from starlette.testclient import TestClient

from dispatcher.dashboard.app import build_app
from dispatcher.dashboard.settings import DashboardSettings

_CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"|name="csrf" value="([^"]+)"')


@contextmanager
def dashboard_client(target: str, scheme: str = "http", **settings: object) -> Iterator[TestClient]:
    """``scheme="https"``: the requests look as if they came over TLS (the Secure cookies go back)."""
    app = build_app(DashboardSettings(target=target, **settings))  # type: ignore[arg-type]
    with TestClient(app, base_url=f"{scheme}://127.0.0.1", follow_redirects=False) as client:
        yield client


def csrf_of(html: str) -> str:
    found = _CSRF.search(html)
    assert found, "no CSRF token in the page"
    return found.group(1) or found.group(2)


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event, data) pairs of a server-sent events body."""
    events = []
    for block in text.strip().split("\n\n"):
        name, data = "message", []
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        events.append((name, "\n".join(data)))
    return events
