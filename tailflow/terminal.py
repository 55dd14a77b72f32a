"""What the CLI shows of a run that fails on the user's input: the one line, not Prefect's traceback.

Prefect logs a failed flow run's exception, with its traceback, through its
run loggers; their records reach the terminal through the root logger's
console handler and the server through the API handler. For user errors the
CLI prints `tailflow: error: <line>` itself, so the terminal handler drops
those records while the API handler keeps them: the traceback stays in the
flow run's Logs tab for whoever wants it.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator


class DropUserErrors(logging.Filter):
    def __init__(self, errors: tuple[type[BaseException], ...]):
        super().__init__()
        self.errors = errors

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], self.errors):
            return False
        # "Finished in state Failed('Flow run encountered an exception: DatasetError: ...')": said once, by us
        message = record.getMessage()
        return not any(f"{error.__name__}: " in message for error in self.errors)


@contextmanager
def quiet_tracebacks_of(errors: tuple[type[BaseException], ...]) -> Iterator[None]:
    """Inside: records about `errors` do not reach the terminal handlers (the root logger's, Prefect's)."""
    quiet = DropUserErrors(errors)
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)]
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)
