"""What every asyncio task of the process is waiting on, logged on SIGUSR1 (``kill -USR1 PID``): the
answer to "the dispatcher is up but does nothing", as a thread dump answers it for a threaded server.
A task's own ``get_stack()`` shows one frame of a suspended coroutine; the whole chain is followed
here, through each coroutine's ``cr_await``, down to the future it waits for."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

log = structlog.get_logger("shardq.tasks")
#: Frames shown per task at most: a chain deeper than this is cut (its innermost frames are kept).
MAX_FRAMES = 40


def awaiting_chain(task: asyncio.Task[Any]) -> list[str]:
    """``file:line function`` of each coroutine the task is suspended in, outermost first, and what
    the innermost one awaits when it is not a coroutine."""
    frames: list[str] = []
    awaitable: Any = task.get_coro()
    seen = 0
    while awaitable is not None and seen < 1000:
        seen += 1
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            if not hasattr(awaitable, "cr_await") and not hasattr(awaitable, "gi_yieldfrom"):
                frames.append(f"awaiting {type(awaitable).__name__}")
            break
        code = frame.f_code
        frames.append(f"{code.co_filename}:{frame.f_lineno} {code.co_name}")
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
    return frames[-MAX_FRAMES:]


def dump_tasks() -> int:
    """Log every task of the running loop with its chain. Returns how many."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    for task in tasks:
        log.warning("task", task=task.get_name(), awaiting=awaiting_chain(task))
    log.warning("tasks dumped", tasks=len(tasks))
    return len(tasks)
