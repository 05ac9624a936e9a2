"""Names of a prompt's full KV blocks for prefix caching: a chained SHA-256 of (parent, tokens).

The same name at position i means the same tokens from the first up to the end of block i, so a
run of cached names from the first is KV another prompt may reuse. The full 256-bit digest is the
name (vLLM's sha256 block hash), so two different prefixes never share one. Torch-free: the
router names prompts with it too, and both sides must agree bit for bit.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """The chained hash of each full ``block_size``-token block of ``token_ids`` (a partial last
    block has none: only full blocks are cached)."""
    if block_size < 1:
        raise ValueError(f"block size must be at least 1, got {block_size}")
    names, parent = [], b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hashlib.sha256(parent + array("q", token_ids[start:start + block_size]).tobytes()).digest()
        names.append(int.from_bytes(parent, "big"))
    return tuple(names)
