"""The architecture holds: the import contracts in pyproject.toml ([tool.importlinter]) are kept.

They state that a worker never imports the dispatcher, that shardmap and shardq_common import nothing
above them, that the dispatcher's commands use only the SDK's public API, and the layers inside
dispatcher/. A broken contract fails here with each offending import and its line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    env = dict(os.environ)
    # The packages of this checkout, whatever an installed copy of the project points at.
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--no-cache"],
        cwd=ROOT,  # it reads the contracts from ./pyproject.toml
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"lint-imports exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
