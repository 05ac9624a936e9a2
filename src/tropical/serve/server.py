"""`tropical serve`: build the app whose start-up launches the cluster, then run it with uvicorn.

uvicorn opens the port only after start-up, so the server is reachable exactly when every worker
is ready. SIGTERM (or Ctrl-C) drains: the port stays open and new requests get 503 while those in
flight finish (up to --drain-timeout; streams still running then end with an error event), then
uvicorn shuts down and the workers stop. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from tropical.serve.http.app import MIB, ServerState, ServingRouter, add_routes
from tropical.serve.http.auth import resolve_api_key
from tropical.serve.http.prompts import Limits
from tropical.serve.metrics import ServerMetrics
from tropical.serve.mock.launch import launch_mock
from tropical.serve.options import ServeOptions
from tropical.serve.vllm.launch import VllmCluster, launch_vllm
from tropical.serve.workers.launch import Cluster, launch

Launch = Callable[[ServeOptions, ServerMetrics], Awaitable[Cluster | VllmCluster]]
LAUNCHERS: dict[str, Launch] = {"tropical": launch, "vllm": launch_vllm, "mock": launch_mock}
"""What starts each engine's workers and the router over them."""

FLUSH_S = 5
"""uvicorn's own graceful shutdown, after the router's drain: time for the last responses (error
events included) to be written before connections are closed."""


def build_app(options: ServeOptions, state: ServerState) -> FastAPI:
    """The app; with an API key the generated API docs (/docs, /redoc, /openapi.json) are off, since
    they would answer without it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        say(f"starting {options.policy} with model {options.model} ...")
        cluster = await LAUNCHERS[options.engine](options, state.metrics)
        state.model_id = cluster.model_name
        state.limits = Limits(cluster.max_model_len, options.max_logprobs, options.max_n,
                              options.logprobs_mode == "processed_logprobs")
        router: ServingRouter = cluster.router
        state.created, state.router = int(time.time()), router
        say(cluster.profile_note)
        roles = ", ".join(f"{w.id}:{w.role.value} (pid {c.pid} on {c.node})"
                          for w, c in zip(router.workers, router.clients, strict=True))
        say(f"workers {roles}")
        say(ready_message(options, state.model_id, state.api_key is not None))
        try:
            yield
        finally:
            say("draining ...")
            await cluster.router.drain(options.drain_timeout)
            await cluster.stop()
            say("stopped")

    docs: dict[str, Any] = {} if state.api_key is None else {"docs_url": None, "redoc_url": None,
                                                              "openapi_url": None}
    app = FastAPI(title="tropical", lifespan=lifespan, **docs)
    add_routes(app, state)
    return app


def ready_message(options: ServeOptions, model_id: str, keyed: bool) -> str:
    """Where to reach the server; never the key itself (logs are read by more people than keys)."""
    url = f"http://{options.host}:{options.port}"
    auth = ' -H "Authorization: Bearer $TROPICAL_API_KEY"' if keyed else ""
    body = shlex.quote(f'{{"model": "{model_id}", "messages": [{{"role": "user", "content": "Hello!"}}]}}')
    return (f"ready: listening on {url} (OpenAI API at {url}/v1, metrics at {url}/metrics)\n"
            f"  try: curl {url}/v1/chat/completions -H 'content-type: application/json'{auth} -d {body}")


def say(message: str) -> None:
    print(f"tropical: {message}", flush=True)


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT drains the router before uvicorn stops listening."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float) -> None:
        super().__init__(config)
        self.state, self.drain_timeout = state, drain_timeout
        self.drain_signal: int | None = None
        self.draining: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Runs in the signal handler: only note the signal; ``on_tick`` starts the drain."""
        if self.drain_signal is None and self.state.router is not None:
            self.drain_signal = sig
        else:
            super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_signal is not None and self.draining is None:
            self.draining = asyncio.create_task(self._drain(self.drain_signal))
        return await super().on_tick(counter)

    async def _drain(self, sig: int) -> None:
        router = self.state.router
        if router is None:
            raise RuntimeError("drain started before the router was up")
        say("draining: new requests get 503 while those in flight finish ...")
        await router.drain(self.drain_timeout)
        super().handle_exit(sig, None)


def server_state(options: ServeOptions) -> ServerState:
    """What the endpoints read before and after the workers are up: model id, key, body limit."""
    return ServerState(model_id=options.served_model_name or options.model,
                       api_key=resolve_api_key(options.api_key, options.api_key_file, os.environ),
                       max_body_bytes=int(options.max_body_mb * MIB))


def serve(options: ServeOptions) -> None:
    state = server_state(options)
    config = uvicorn.Config(build_app(options, state), host=options.host, port=options.port,
                            log_level="warning", timeout_graceful_shutdown=FLUSH_S)
    DrainingServer(config, state, options.drain_timeout).run()
