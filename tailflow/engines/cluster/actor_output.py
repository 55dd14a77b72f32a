"""What Ray actors write to stderr (warnings, errors, tracebacks), handed to a callback as well as to the terminal.

Ray's driver receives every worker's output and prints it (`log_to_driver`);
it does so through a dispatcher that takes more handlers. The run adds one so
that actor warnings and errors also reach the flow run's Prefect logs, where
users look (stdout, the actors' ordinary chatter, is left to the terminal).
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Callable, Iterator

HANDLER_NAME = "tailflow_actor_stderr"
SEVERE = re.compile(r"\b(ERROR|CRITICAL|Traceback|\w*Error|\w*Exception)\b")


def source_of(data: dict) -> str:
    name = data.get("actor_name") or data.get("task_name") or "worker"
    return f"{name} pid={data.get('pid')}"


@contextmanager
def actor_stderr_to(callback: Callable[[str, bool], None]) -> Iterator[None]:
    """Inside: `callback(line, is_severe)` for each stderr line of this driver's Ray workers."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher

    def handle(data: dict) -> None:
        if data.get("is_err"):
            for line in data.get("lines", []):
                if line.strip():
                    callback(f"({source_of(data)}) {line}", bool(SEVERE.search(line)))

    global_worker_stdstream_dispatcher.add_handler(HANDLER_NAME, handle)
    try:
        yield
    finally:
        global_worker_stdstream_dispatcher.remove_handler(HANDLER_NAME)
