"""What a worker's code type-checks against stays typed: worker_sdk (which ships py.typed), the
shardq_common modules it is built on and shardmap are clean under ``mypy --strict`` ([tool.mypy] in
pyproject.toml; the stubs of grpc and protobuf come with the test extra)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["worker_sdk", "shardq_common", "shardmap"]


def test_sdk_packages_are_mypy_strict_clean() -> None:
    if importlib.util.find_spec("mypy") is None:
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail("CI needs mypy: the test extra installs it (pip install -e '.[test]')", pytrace=False)
        pytest.skip("mypy is not installed: pip install -e '.[test]' installs it")
    proc = subprocess.run(
        # No cache: a stale one could hide an error, and the checkout stays clean.
        [sys.executable, "-m", "mypy", "--cache-dir", os.devnull, *PACKAGES],
        cwd=ROOT,  # it reads [tool.mypy] from ./pyproject.toml
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"mypy exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
