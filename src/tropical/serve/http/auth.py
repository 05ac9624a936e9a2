"""The API key: where it comes from and how a request's key is checked.

A key given on the command line shows in `ps` to every user of the machine, so it may also come from
a file or the environment (vLLM's `VLLM_API_KEY`, which its users already set). Keys are compared in
constant time, so how long a refusal takes says nothing about how much of a guess was right.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from pathlib import Path

KEY_VARIABLES = ("TROPICAL_API_KEY", "VLLM_API_KEY")


def resolve_api_key(flag: str | None, file: str | None, environ: Mapping[str, str]) -> str | None:
    """``--api-key``, else the first line of ``--api-key-file``, else the first variable of
    ``KEY_VARIABLES`` that is set; None: no key is required."""
    if flag is not None and file is not None:
        raise ValueError("give --api-key or --api-key-file, not both")
    if flag is not None:
        return _non_empty(flag, "--api-key")
    if file is not None:
        lines = Path(file).read_text().splitlines()
        return _non_empty(lines[0].strip() if lines else "", f"--api-key-file {file}")
    return next((environ[name] for name in KEY_VARIABLES if environ.get(name)), None)


def _non_empty(key: str, where: str) -> str:
    if not key:
        raise ValueError(f"{where} gives an empty API key")
    return key


def key_matches(expected: str, authorization: str) -> bool:
    """Whether an Authorization header carries ``expected`` as its bearer token."""
    return hmac.compare_digest(authorization.encode(), f"Bearer {expected}".encode())
