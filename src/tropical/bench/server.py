"""Where the server is and what it serves, asked once before the run (GET /v1/models)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A server's base URL (``/v1`` added by the client, so either spelling works) and key."""

    url: str
    api_key: str | None = None

    @property
    def base(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The model to ask for and its context length, when the server reports one (vLLM does)."""

    id: str
    max_model_len: int | None = None


def served_model(endpoint: Endpoint, name: str | None, timeout: float = 30.0) -> ServedModel:
    """``name`` (or the server's first model) with the context length /v1/models reports.

    With ``name`` given, a server without /v1/models is still benchmarked, without a context cap.
    """
    try:
        models = _list_models(endpoint, timeout)
    except (httpx.HTTPError, ValueError) as err:
        if name is not None:
            return ServedModel(name)
        raise ValueError(f"cannot list models at {endpoint.base}/v1/models ({err}); pass --model") from None
    if name is None:
        if not models:
            raise ValueError(f"{endpoint.base}/v1/models lists no models")
        name = models[0]["id"]
    card = next((m for m in models if m.get("id") == name), {})
    return ServedModel(name, card.get("max_model_len"))


def _list_models(endpoint: Endpoint, timeout: float) -> list[dict]:
    resp = httpx.get(f"{endpoint.base}/v1/models", headers=endpoint.headers, timeout=timeout)
    resp.raise_for_status()
    return list(resp.json().get("data", []))
