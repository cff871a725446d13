"""Each peer in an environment of its own under the cache folder: a venv per Python peer, an npm
folder for BullMQ. Made once and reused while the requirements are unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".bench-cache"


class SetupError(RuntimeError):
    """A peer's environment could not be made; the message holds the installer's last lines."""


def _run(argv: list[str], log: Path, cwd: Path | None = None) -> None:
    with open(log, "ab") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, timeout=900)
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SetupError(f"{' '.join(argv[:4])} … exited with {result.returncode}:\n{tail}")


def python_venv(name: str, requirements: list[str]) -> Path:
    """The interpreter of ``.bench-cache/venvs/<name>`` with ``requirements`` installed."""
    venv = CACHE / "venvs" / name
    python = venv / "bin" / "python"
    stamp = venv / ".bench-requirements"
    wanted = "\n".join(requirements)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / f"{name}.install.log"
    log.unlink(missing_ok=True)
    _run([sys.executable, "-m", "venv", "--clear", str(venv)], log)
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *requirements], log)
    stamp.write_text(wanted)
    return python


def node_modules(packages: list[str]) -> Path:
    """``.bench-cache/node/node_modules`` with ``packages`` installed from npm."""
    folder = CACHE / "node"
    modules = folder / "node_modules"
    stamp = folder / ".bench-requirements"
    wanted = "\n".join(packages)
    if modules.exists() and stamp.exists() and stamp.read_text() == wanted:
        return modules
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "install.log"
    log.unlink(missing_ok=True)
    if not (folder / "package.json").exists():
        (folder / "package.json").write_text('{"name": "shardq-bench-peers", "private": true}\n')
    _run(["npm", "install", "--no-audit", "--no-fund", *packages], log, cwd=folder)
    stamp.write_text(wanted)
    return modules
