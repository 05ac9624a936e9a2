"""`tropical serve`: build the app whose start-up launches the cluster, then run it with uvicorn.

uvicorn opens the port only after start-up, so the server is reachable exactly when every worker
is ready. SIGTERM (or Ctrl-C) drains: new requests get 503 while those in flight finish, then
the workers stop.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from tropical.serve.app import ServerState, add_routes
from tropical.serve.launch import launch
from tropical.serve.options import ServeOptions
from tropical.serve.vllm_launch import launch_vllm


def build_app(options: ServeOptions) -> FastAPI:
    state = ServerState(model_id=options.served_model_name or options.model, api_key=options.api_key)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        say(f"starting {options.policy} with model {options.model} ...")
        cluster = await (launch_vllm if options.engine == "vllm" else launch)(options, state.metrics)
        state.model_id, state.max_model_len = cluster.model_name, cluster.max_model_len
        state.created, state.router = int(time.time()), cluster.router
        say(cluster.profile_note)
        roles = ", ".join(f"{w.id}:{w.role.value} (pid {c.pid} on {c.node})"
                          for w, c in zip(cluster.router.workers, cluster.clients, strict=True))
        say(f"workers {roles}")
        say(ready_message(options, state.model_id))
        try:
            yield
        finally:
            say("draining ...")
            await cluster.router.drain(options.drain_timeout)
            await cluster.stop()
            say("stopped")

    app = FastAPI(title="tropical", lifespan=lifespan)
    add_routes(app, state)
    return app


def ready_message(options: ServeOptions, model_id: str) -> str:
    url = f"http://{options.host}:{options.port}"
    auth = f" -H {shlex.quote('Authorization: Bearer ' + options.api_key)}" if options.api_key else ""
    body = shlex.quote(f'{{"model": "{model_id}", "messages": [{{"role": "user", "content": "Hello!"}}]}}')
    return (f"ready: listening on {url} (OpenAI API at {url}/v1, metrics at {url}/metrics)\n"
            f"  try: curl {url}/v1/chat/completions -H 'content-type: application/json'{auth} -d {body}")


def say(message: str) -> None:
    print(f"tropical: {message}", flush=True)


def serve(options: ServeOptions) -> None:
    uvicorn.run(build_app(options), host=options.host, port=options.port, log_level="warning",
                timeout_graceful_shutdown=int(options.drain_timeout))
