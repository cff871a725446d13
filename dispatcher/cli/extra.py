"""The dispatcher extra: the daemon's dependencies, which an install for producers and workers leaves out."""

from __future__ import annotations

import re
from importlib import metadata

INSTALL_EXTRA = "pip install 'shardq[dispatcher]'"

# Read from the installed metadata, so the list is pyproject.toml's and never a copy that drifts.
_OF_DISPATCHER_EXTRA = re.compile(r"""extra\s*==\s*["']dispatcher["']""")
_DISTRIBUTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def missing_dispatcher_extra() -> list[str]:
    """The distributions of the dispatcher extra that are not installed. Empty when shardq itself has no
    installed metadata (run from a checkout): then there is nothing to compare with."""
    try:
        requirements = metadata.requires("shardq") or []
    except metadata.PackageNotFoundError:
        return []
    missing = set()
    for requirement in requirements:
        name = _DISTRIBUTION_NAME.match(requirement)
        if name is None or not _OF_DISPATCHER_EXTRA.search(requirement):
            continue
        try:
            metadata.distribution(name.group(0))
        except metadata.PackageNotFoundError:
            missing.add(name.group(0))
    return sorted(missing)


def missing_extra_message(what: str, missing: list[str]) -> str:
    return f"{what} needs the dispatcher extra ({', '.join(missing)} not installed): {INSTALL_EXTRA}"
