"""The worker SDK's public surface: one client definition in two flavours, typed results, explicit
options, and a worker that cannot be silently left unrun."""

from __future__ import annotations

import collections.abc
import gc
import inspect
import typing

import pytest

import worker_sdk
from worker_sdk import AsyncClient, Client, JobContext, Worker, serve

ADDRESS = "127.0.0.1:9"  # nothing answers; these tests never reach a dispatcher
SECURITY_OPTIONS = ("token", "tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name")
TYPED_RESULTS = (
    "JobInfo",
    "QueueStats",
    "ScheduleInfo",
    "ShardMap",
    "ShardInfo",
    "DispatcherInfo",
    "RebalancePlan",
    "ShardMove",
    "VersionInfo",
)


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def _hints(function: typing.Any) -> dict[str, typing.Any]:
    return typing.get_type_hints(function, vars(worker_sdk._client))


#: Methods that stream: a generator in Client, an async generator in AsyncClient, of the same items.
STREAMING = {"watch"}


def test_client_and_async_client_expose_the_same_methods_with_the_same_signatures():
    sync_methods, async_methods = _public_methods(Client), _public_methods(AsyncClient)
    assert sorted(async_methods) == sorted(sync_methods)
    for name, signature in sync_methods.items():
        assert async_methods[name].parameters == signature.parameters, name
        async_hints, sync_hints = _hints(getattr(AsyncClient, name)), _hints(getattr(Client, name))
        if name in STREAMING:
            assert inspect.isasyncgenfunction(getattr(AsyncClient, name)), name
            assert inspect.isgeneratorfunction(getattr(Client, name)), name
            async_return, sync_return = async_hints.pop("return"), sync_hints.pop("return")
            assert typing.get_origin(async_return) is collections.abc.AsyncIterator, name
            assert typing.get_origin(sync_return) is collections.abc.Iterator, name
            assert typing.get_args(async_return) == typing.get_args(sync_return), name
            assert async_hints == sync_hints, name
            continue
        assert async_hints == sync_hints, name
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
        assert not inspect.iscoroutinefunction(getattr(Client, name)), name
    assert inspect.signature(AsyncClient.__init__) == inspect.signature(Client.__init__)


@pytest.mark.parametrize("name", TYPED_RESULTS)
def test_typed_results_are_exported(name):
    assert name in worker_sdk.__all__
    result = getattr(worker_sdk, name)
    assert result.__module__.startswith("worker_sdk") and inspect.isclass(result)


def test_no_client_method_returns_a_protobuf_message():
    for name in _public_methods(Client):
        returned = repr(_hints(getattr(Client, name)).get("return"))
        assert "_pb2" not in returned and "protobuf" not in returned, (name, returned)


@pytest.mark.parametrize("entry", [Client.__init__, AsyncClient.__init__, Worker.__init__, serve])
def test_security_options_are_explicit_keywords(entry):
    parameters = inspect.signature(entry).parameters
    assert not [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    for option in SECURITY_OPTIONS:
        assert parameters[option].kind is inspect.Parameter.KEYWORD_ONLY, option
        assert parameters[option].default is None, option


def test_serve_takes_the_worker_options():
    worker_options = dict(inspect.signature(Worker.__init__).parameters)
    del worker_options["self"]
    assert dict(inspect.signature(serve).parameters) == worker_options


def test_the_job_context_has_an_id():
    ctx = JobContext("job-1", "t", b"", 1, 5, "default", 0, "", 0, "token", 0)
    assert ctx.id == ctx.job_id == "job-1"


async def test_a_worker_served_in_a_running_loop_and_never_run_warns():
    """Like a coroutine never awaited: inside an event loop ``serve()`` returns the worker to await,
    and dropping it unrun would otherwise serve nothing, silently."""
    with pytest.warns(RuntimeWarning, match="never run"):
        serve({"t": lambda ctx: None}, target=ADDRESS, handle_signals=False)
        gc.collect()


async def test_a_worker_that_ran_does_not_warn():
    worker = serve({"t": lambda ctx: None}, target=ADDRESS, handle_signals=False)
    async with worker:
        pass
    del worker
    gc.collect()  # filterwarnings=error: a RuntimeWarning here fails the test
