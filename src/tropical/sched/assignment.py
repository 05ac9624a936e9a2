"""A policy's decision about one request: where it prefills, by which path, and why.

Apart from the policy interface so that what reads decisions (admission, the cluster) needs no
policy to import.
"""

from __future__ import annotations

from dataclasses import dataclass

from tropical.core.request import PrefillPath, Request


@dataclass(slots=True)
class Assignment:
    """Prefill ``request`` on worker ``worker_id``; ``path`` and ``reason`` are recorded on it.

    ``from_worker`` names the worker whose queue the request leaves (a reassignment); ``yields``:
    the request gives up its place there for good (see ``Request.yielded``); ``first_token``: when
    the policy predicts its first token on this path, where it predicts one (admission reads it).

    A value: never change one. Not frozen, and it writes its constructor, which mypyc compiles
    (see ``BatchShape``): the toggle builds one per decision it takes.
    """

    request: Request
    worker_id: int
    path: PrefillPath
    reason: str
    from_worker: int | None = None
    yields: bool = False
    first_token: float | None = None

    def __init__(self, request: Request, worker_id: int, path: PrefillPath, reason: str,
                 from_worker: int | None = None, yields: bool = False,
                 first_token: float | None = None) -> None:
        self.request = request
        self.worker_id = worker_id
        self.path = path
        self.reason = reason
        self.from_worker = from_worker
        self.yields = yields
        self.first_token = first_token
