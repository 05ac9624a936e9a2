"""Start (or attach to) the vLLM instances of `tropical serve --engine vllm` and route over them.

Started instances serve a Hugging Face directory: ``--model`` when it is one, else the model
exported once (``tropical export``) under the cache. Their logs go to ``--vllm-out``. Attached
instances (``--worker-urls prefill=URL,multiplex=URL``) take their roles from the list. Either
way the router waits until every instance answers, reads each one's KV cache size from its
/metrics, and prices the policy with a profile: ``--profile``, a cached one, or one measured now
over HTTP (``tropical profile --server``) on the first instance.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tropical.config import slo_spec
from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.online import OnlineLatency
from tropical.engine.loader import cache_root
from tropical.engine.profiler import profile_document
from tropical.engine.tokenizer import Tokenizer
from tropical.sched.fleet import worker_states
from tropical.sched.rules import Role
from tropical.serve.metrics import ServerMetrics
from tropical.serve.options import ServeOptions, policy_and_roles
from tropical.serve.process import free_port
from tropical.serve.profiles import ProfileSource, choose_profile
from tropical.serve.router import RouterSettings
from tropical.serve.vllm.driver import VllmDriver
from tropical.serve.vllm.instance import VllmInstance
from tropical.serve.vllm.process import VllmLaunch, VllmProcess, core_sets
from tropical.serve.vllm.profile import HTTP_GRIDS, kv_bytes_per_token, profile_server

CACHE_INFO = re.compile(r'vllm:cache_config_info\{([^}]*)\}')


@dataclass
class VllmCluster:
    """What `tropical serve` holds while the vLLM engine serves (the shape of ``workers.launch.Cluster``)."""

    router: VllmDriver
    clients: list[VllmInstance]
    profile_note: str
    model_name: str
    max_model_len: int

    async def stop(self) -> None:
        for worker in self.router.workers:
            online = worker.latency
            if isinstance(online, OnlineLatency):
                print(f"tropical: vLLM instance {worker.id} ran at x{online.prefill_scale:.2f} (prefill) "
                      f"and x{online.decode_scale:.2f} (decode) of its profile's prediction "
                      f"({online.observations} observations)", flush=True)
        await self.router.stop()
        await asyncio.gather(*(asyncio.to_thread(c.process.stop) for c in self.clients if c.process))


async def launch_vllm(options: ServeOptions, metrics: ServerMetrics) -> VllmCluster:
    """Instances up and answering, a profile, the Cluster's mirrors of them, and the driver."""
    urls = parse_worker_urls(options.worker_urls) if options.worker_urls else None
    if urls is not None:
        options = replace(options, workers=",".join(role.value for role, _ in urls), worker_urls=None)
    policy, roles = policy_and_roles(options)
    model_dir = model_directory(options)
    name = options.served_model_name or Path(options.model).stem
    instances = (attach(urls, roles, name) if urls is not None
                 else start(options, roles, model_dir, name))
    try:
        await asyncio.gather(*(i.wait_ready(options.start_timeout) for i in instances))
        if urls is not None and options.served_model_name is None:
            name = await served_name(instances)
        source = _profile_source(options, instances[0], model_dir)
        latency, note = await choose_profile(options.profile, source)
        pools = await asyncio.gather(*(kv_pool(i, options) for i in instances))
        one_block_size(pools, options.prefix_cache)
    except BaseException:
        await asyncio.gather(*(asyncio.to_thread(i.process.stop) for i in instances if i.process))
        raise
    # vLLM plans its own iterations: every mirror learns their speed online, whatever the policy.
    # Each mirror models its instance's prefix cache in the instance's own block size (see driver).
    workers = worker_states(policy, roles, pools, [latency] * len(roles), options.prefix_cache, online=True)
    settings = RouterSettings(options.max_waiting, slo_spec(options), options.max_model_len)
    tokenizer = Tokenizer.from_hf_dir(model_dir)
    router = VllmDriver(policy, workers, instances, tokenizer, latency, settings, metrics,
                        options.start_timeout)
    router.start()
    return VllmCluster(router, instances, note, name, options.max_model_len)


def parse_worker_urls(spec: str) -> list[tuple[Role, str]]:
    """``prefill=URL,multiplex=URL`` into (role, URL) pairs, in order."""
    pairs = []
    for entry in spec.split(","):
        role, sep, url = entry.partition("=")
        if not sep or not url.strip().startswith(("http://", "https://")):
            raise ValueError(f"--worker-urls entry {entry!r} is not ROLE=http://HOST:PORT")
        try:
            pairs.append((Role(role.strip().lower()), url.strip().rstrip("/")))
        except ValueError:
            raise ValueError(f"unknown role {role.strip()!r} in --worker-urls; choose from "
                             f"{', '.join(r.value for r in Role)}") from None
    return pairs


def attach(urls: list[tuple[Role, str]], roles: list[Role], name: str) -> list[VllmInstance]:
    """Running instances in the policy's role order (the n-th URL of a role is its n-th worker)."""
    by_role: dict[Role, list[str]] = {}
    for role, url in urls:
        by_role.setdefault(role, []).append(url)
    return [VllmInstance(by_role[role].pop(0), name) for role in roles]


def start(options: ServeOptions, roles: list[Role], model_dir: Path, name: str) -> list[VllmInstance]:
    """One vLLM server per worker, each on its own cores, logging under ``--vllm-out``."""
    python = options.vllm_python
    if not Path(python).is_file():
        raise ValueError(f"no vLLM Python at {python}; install vLLM with: bash scripts/setup-vllm.sh "
                         f"(or pass --vllm-python, or attach to running servers with --worker-urls)")
    cores = core_sets(len(roles), sorted(os.sched_getaffinity(0)))
    out = Path(options.vllm_out)
    instances = []
    for i, role in enumerate(roles):
        launch = VllmLaunch(python, str(model_dir), name, role, free_port(), free_port(), cores[i],
                            out / f"vllm-{i}-{role.value}.log", options.dtype, options.max_model_len,
                            options.max_batched_tokens, nixl_poll_delay_us=options.nixl_poll_delay_us,
                            prefix_cache=options.prefix_cache)
        instances.append(VllmInstance(launch.url, name, VllmProcess.start(launch)))
    return instances


def model_directory(options: ServeOptions) -> Path:
    """``--model`` if it is a Hugging Face directory, else that model exported once into the cache."""
    given = Path(options.model)
    if (given / "config.json").is_file():
        return given
    target = cache_root(None) / "vllm-models" / f"{given.stem}-{options.dtype}"
    if not (target / "config.json").is_file():
        import torch

        from tropical.engine.export import save_hf_dir
        from tropical.engine.loader import load_model

        save_hf_dir(load_model(options.model, dtype=getattr(torch, options.dtype)), target)
    return target


async def served_name(instances: list[VllmInstance]) -> str:
    """The model id attached instances serve (the first one's), which clients then use too."""
    ids = []
    for instance in instances:
        reply = await instance.client.get(f"{instance.url}/v1/models", timeout=30)
        instance.model = reply.json()["data"][0]["id"]
        ids.append(instance.model)
    if len(set(ids)) > 1:
        raise ValueError(f"the --worker-urls instances serve different models: {', '.join(ids)}")
    return ids[0]


async def kv_pool(instance: VllmInstance, options: ServeOptions) -> tuple[int, int]:
    """(blocks, block size) of the instance's KV cache from vLLM's cache_config_info metric;
    ``--kv-tokens`` when the server does not publish it."""
    text = (await instance.client.get(f"{instance.url}/metrics", timeout=10)).text
    match = CACHE_INFO.search(text)
    labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))) if match else {}
    blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    if blocks.isdigit() and size.isdigit() and int(blocks) > 0:
        return int(blocks), int(size)
    return options.kv_tokens // options.block_size, options.block_size


def one_block_size(pools: list[tuple[int, int]], prefix_cache: bool) -> None:
    """The router names a prompt's prefix blocks in one block size, the instances' own: with the
    prefix cache on they must all use the same one."""
    sizes = sorted({size for _, size in pools})
    if prefix_cache and len(sizes) > 1:
        raise ValueError(f"the vLLM instances use different KV block sizes ({', '.join(map(str, sizes))} "
                         f"tokens), but the router names prompt prefixes in one: start them with the "
                         f"same --block-size, or serve with --prefix-cache off")


def _profile_source(options: ServeOptions, instance: VllmInstance, model_dir: Path) -> ProfileSource:
    """vLLM's profile: cached per model, dtype and core count; measured over HTTP on the first
    instance (``tropical profile --server``)."""

    async def measure() -> tuple[FittedModel, dict[str, Any]]:
        config = json.loads((model_dir / "config.json").read_text())
        kv_bytes = kv_bytes_per_token(config, options.dtype)
        result = await profile_server(instance, HTTP_GRIDS["quick"], kv_bytes)
        return result.model, profile_document(result)

    cores = len(os.sched_getaffinity(0))
    return ProfileSource(f"vllm-{model_dir.name}-{options.dtype}-c{cores}.json", measure,
                         "latency profile of vLLM", "vLLM instance 0 over HTTP")
