"""RollPacker's own per-prompt length logs, as a length source.

With `REPORT_LENGTH_AND_REWARDS=1`, RollPacker's scheduler appends one JSON
line per completed prompt to `length/response-length-and-rewards-ep<N>.jsonl`:
`{"domain": ..., "prompt_hash": ..., "response_lengths": [...], ...}`. Only
completed prompts' kept responses are logged, so a short round's lines are
biased short; its long rounds log the deferred prompts in full. The file has
no prompt lengths (every prompt counts `DEFAULT_PROMPT_TOKENS`) and no cap (the
longest logged response unless one is given).
"""
from __future__ import annotations

import json
from pathlib import Path

from tailflow.engines.sim.lengths import PromptPoolLengths
from tailflow.engines.track.rollout_trace import TraceError

DEFAULT_PROMPT_TOKENS = 256


def read_rollpacker_lengths(path: str | Path, max_new_tokens: int | None = None, seed: int = 0) -> PromptPoolLengths:
    """Pools of response lengths per prompt (lines of one prompt, e.g. from several epochs, are merged)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such RollPacker length file") from None
    pools: dict[str, list[int]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"{where}: not JSON ({error.msg})") from None
        if not isinstance(data, dict):
            raise TraceError(f"{where}: a line must be a JSON object")
        lengths = data.get("response_lengths")
        if not isinstance(lengths, list) or not lengths or any(not isinstance(n, int) or n < 1 for n in lengths):
            raise TraceError(f"{where}: field 'response_lengths' must be a non-empty list of positive integers")
        prompt = data.get("prompt_hash", data.get("prompt_id"))
        if prompt is None:
            raise TraceError(f"{where}: missing field 'prompt_hash'")
        pools.setdefault(str(prompt), []).extend(lengths)
    if not pools:
        raise TraceError(f"{path}: no prompts (empty file)")
    cap = max_new_tokens or max(n for lengths in pools.values() for n in lengths)
    return PromptPoolLengths(pools, {p: DEFAULT_PROMPT_TOKENS for p in pools}, cap, seed, source=str(path))
