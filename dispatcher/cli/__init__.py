"""The commands: ``dispatcher`` (run, demo, ...), ``dispatcherctl`` and their tables."""

from __future__ import annotations
