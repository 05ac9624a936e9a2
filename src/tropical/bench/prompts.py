"""Prompts of a given token length, as token ids or as text, sharing prefixes where the trace does.

The ids are random (seeded) so that a server's prefix cache hits only where the trace says two
requests share a prefix: Mooncake's ``hash_ids`` name 512-token blocks, and equal hashes get
equal tokens in every request; the rest of a prompt is unique to its request.
"""

from __future__ import annotations

import numpy as np

from tropical.bench.plan import PlannedRequest

BLOCK_TOKENS = 512
# Ids present in any vocabulary of 500+ tokens and clear of the low ids where special tokens live.
TOKEN_IDS = (100, 500)
# Common English words that most BPE tokenizers encode as one token each (with the leading space).
COMMON_WORDS = ("the of and to in is you that it he was for on are as with his they at be this from have "
         "or by one had not but what all were when we there can an your which their said if do will "
         "each about how up out them then she many some so these would other into has more her two "
         "like him see time could no make than first been its who now people my made over did down "
         "only way find use may water long little very after words called just where most know get "
         "through back much go good new write our me man too any day same right look think also "
         "around another came come work three word must because does part even place well")
WORDS = tuple(COMMON_WORDS.split())


def token_ids(req: PlannedRequest, seed: int) -> list[int]:
    """``req.prompt_len`` ids: its prefix blocks' shared ids, then ids unique to the request."""
    blocks = [_ids(BLOCK_TOKENS, 0, h, seed) for h in req.prefix_blocks]
    shared = np.concatenate(blocks)[:req.prompt_len] if blocks else np.empty(0, dtype=np.int64)
    own = _ids(req.prompt_len - len(shared), 1, req.id, seed)
    return np.concatenate([shared, own]).tolist()


def text(req: PlannedRequest, seed: int) -> str:
    """About ``req.prompt_len`` tokens of words, one word per id so prefixes stay shared."""
    return " ".join(WORDS[i % len(WORDS)] for i in token_ids(req, seed))


def prompt(req: PlannedRequest, fmt: str, seed: int) -> list[int] | str:
    return token_ids(req, seed) if fmt == "ids" else text(req, seed)


def _ids(count: int, kind: int, key: int, seed: int) -> np.ndarray:
    """``count`` ids drawn from a stream keyed by (kind, key, seed): equal keys, equal ids."""
    return np.random.default_rng([kind, key, seed]).integers(*TOKEN_IDS, size=count)
