"""The generated code in shardq_common/pb matches proto/ (run scripts/gen_proto.py after editing proto/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_proto() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"gen_proto.py --check exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
