"""What the driver knows of each request in flight: the request as submitted and the tokens streamed back.

An elastic rollout group (`rollout_group.py`) keeps this so that a worker can
go at any moment: its requests continue elsewhere from here. Each poll adds
the tokens every request gained (`TokenDelta`, from `RolloutWorker.step_streamed`);
a worker that leaves with notice hands over its whole partials (`hand_over`).
Plain data, no Ray.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from tailflow.engines.rollout.protocol import Completion, FinishReason, Request, ResponsePrefix

if TYPE_CHECKING:  # the worker module imports the native engine, which a driver has no use for
    from tailflow.engines.rollout.worker import TokenDelta

NO_TOKENS = ResponsePrefix((), (), ())


class InFlight:
    def __init__(self) -> None:
        self.requests: dict[str, Request] = {}
        """Every request in flight (or waiting for a worker), as last submitted."""
        self.streamed: dict[str, ResponsePrefix] = {}
        """Each request's response tokens so far (its prefix included), with their log-probs and versions."""

    def add(self, requests: Sequence[Request]) -> None:
        for request in requests:
            self.requests[request.request_id] = request
            self.streamed[request.request_id] = request.prefix or NO_TOKENS

    def extend(self, delta: TokenDelta) -> None:
        """Add streamed tokens (a gap, from a lost streamed step, is left to regenerate: what is known stays a
        prefix)."""
        known = self.streamed.get(delta.request_id)
        if known is None or delta.start > len(known.token_ids):
            return
        cut = delta.start
        self.streamed[delta.request_id] = ResponsePrefix(known.token_ids[:cut] + delta.token_ids,
                                                         known.logprobs[:cut] + delta.logprobs,
                                                         known.weight_versions[:cut] + delta.weight_versions)

    def hand_over(self, partials: Sequence[Completion]) -> None:
        """A leaving worker's whole partial responses replace what was streamed of them."""
        for partial in partials:
            if partial.request_id in self.requests:
                self.streamed[partial.request_id] = partial.as_prefix()

    def continued(self, request_ids: Sequence[str]) -> list[Request]:
        """The requests, each to continue from its tokens so far (re-prefilled where it lands)."""
        requests = []
        for request_id in request_ids:
            prefix = self.streamed[request_id]
            requests.append(replace(self.requests[request_id], prefix=prefix if prefix.token_ids else None))
        return requests

    def partial(self, request_id: str, weight_version: int) -> Completion:
        """An aborted completion from the tokens streamed (a request whose worker is gone, or never started)."""
        request, prefix = self.requests[request_id], self.streamed[request_id]
        mixed = any(v != weight_version for v in prefix.weight_versions)
        return request.completion(prefix.token_ids, prefix.logprobs, FinishReason.ABORT, weight_version,
                                  prefix.weight_versions if mixed else ())

    def forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.streamed.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.requests
