"""``python -m bench run ...``: see bench.cli."""

from __future__ import annotations

from .cli import main

main()
