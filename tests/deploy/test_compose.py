"""compose.yaml, checked offline (there is no container engine here): against the Compose
specification's JSON schema, and for the facts that make it right for this repository: every shardq
service is built from the repository's Dockerfile, every SHARDQ_* variable is a setting the
dispatcher or the SDK reads and the dispatcher accepts its values, the URLs name the services and
credentials the file defines, the worker runs the example that exists, and what a service waits on
has a health check.

The schema is the copy the PyPI package check-jsonschema vendors from the compose-spec project
(its licence beside it: check_jsonschema/builtin_schemas/vendor/licenses/LICENSE.compose-spec).
"""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml  # type: ignore[import-untyped]

from dispatcher.config import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
# What the SDK reads besides the dispatcher's settings (worker_sdk: serve() and Client).
SDK_VARIABLES = {"SHARDQ_TARGET", "SHARDQ_TOKEN"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    pytest.importorskip("check_jsonschema", reason="the test extra installs check-jsonschema (the schema)")
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_compose_yaml_is_valid_against_the_compose_specification(
    compose: dict[str, Any], validator: jsonschema.protocols.Validator
) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []


@pytest.mark.parametrize(
    "breakage",
    [
        "an unknown service key",
        "a restart policy that is a list",
        "depends_on a condition that does not exist",
    ],
)
def test_the_schema_refuses_a_broken_file(
    compose: dict[str, Any], validator: jsonschema.protocols.Validator, breakage: str
) -> None:
    """The validation is live: each of these mistakes fails it."""
    broken = copy.deepcopy(compose)
    if breakage == "an unknown service key":
        broken["services"]["worker"]["enviroment"] = {"SHARDQ_TARGET": "dispatcher:7070"}
    elif breakage == "a restart policy that is a list":
        broken["services"]["dispatcher"]["restart"] = ["unless-stopped"]
    else:
        broken["services"]["worker"]["depends_on"]["dispatcher"]["condition"] = "service_ready"
    assert list(validator.iter_errors(broken))


def _dockerfile_env() -> dict[str, str]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    return env


def test_the_shardq_services_are_built_from_the_repositorys_dockerfile(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"redis", "postgres", "dispatcher", "worker"} <= set(services)
    for name in ("dispatcher", "worker"):
        assert services[name]["build"] == ".", name
        assert services[name]["image"] == services["dispatcher"]["image"], name
    assert (ROOT / "Dockerfile").is_file()
    assert 'ENTRYPOINT ["dispatcher"]' in (ROOT / "Dockerfile").read_text()
    assert services["dispatcher"]["command"] == ["run"]  # `dispatcher run`


def test_every_shardq_variable_is_a_setting_and_the_dispatcher_accepts_its_values(
    compose: dict[str, Any],
) -> None:
    settings = {f"SHARDQ_{name.upper()}" for name in Settings.__dataclass_fields__}
    for name, service in compose["services"].items():
        for variable in service.get("environment", {}):
            if variable.startswith("SHARDQ_"):
                assert variable in settings | SDK_VARIABLES, f"{name}: {variable} is read by nothing"
    env = {**_dockerfile_env(), **compose["services"]["dispatcher"]["environment"]}
    Settings.from_env({k: str(v) for k, v in env.items()})  # raises ConfigError on a bad value


def test_the_urls_name_the_services_and_credentials_defined_here(compose: dict[str, Any]) -> None:
    services = compose["services"]
    env = services["dispatcher"]["environment"]
    db = urlsplit(env["SHARDQ_DB_URL"])
    pg = services["postgres"]["environment"]
    assert (db.scheme, db.hostname, db.port) == ("postgresql", "postgres", 5432)
    assert (db.username, db.password, db.path) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        f"/{pg['POSTGRES_DB']}",
    )
    redis_url = urlsplit(env["SHARDQ_REDIS_URL"])
    assert (redis_url.scheme, redis_url.hostname, redis_url.port) == ("redis", "redis", 6379)
    assert env["SHARDQ_ADVERTISE_HOST"] == "dispatcher"
    listen_port = _dockerfile_env()["SHARDQ_LISTEN"].rsplit(":", 1)[1]
    assert services["worker"]["environment"]["SHARDQ_TARGET"] == f"dispatcher:{listen_port}"
    assert f"127.0.0.1:{listen_port}:{listen_port}" in services["dispatcher"]["ports"]
    assert services["dispatcher"]["healthcheck"]["test"][-3:] == [
        "--target",
        f"127.0.0.1:{listen_port}",
        "health",
    ]


def test_the_worker_runs_the_example_that_exists(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    source, mounted = worker["volumes"][0].split(":")[:2]
    assert (ROOT / source).resolve() == ROOT / "examples"
    script = worker["entrypoint"][-1]
    assert mounted == f"{worker['working_dir']}/{Path(script).parent}"
    assert (ROOT / script).is_file()


def test_what_a_service_waits_on_has_a_health_check(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for needed, how in service.get("depends_on", {}).items():
            assert needed in services, f"{name} depends on {needed}, which is not defined"
            if how.get("condition") == "service_healthy":
                assert "healthcheck" in services[needed], f"{name} waits for {needed} to be healthy"
