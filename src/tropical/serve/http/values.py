"""JSON values as the OpenAI endpoints accept them: the error every refusal raises, and the checks
of single fields (booleans, integers, bounded numbers) that name the field when they fail."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any


class APIError(Exception):
    """An error the client caused or must hear about, with the HTTP status and OpenAI's error body."""

    def __init__(
        self, status: int, message: str, type: str = "invalid_request_error",
        param: str | None = None, code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


def shown(value: Any) -> str:
    """A bad value quoted in an error message, cut short so a huge body cannot flood the reply."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite JSON number; integers too big for a float are not (float() would overflow later)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def boolean(data: dict[str, Any], name: str, default: bool, within: str = "") -> bool:
    """`within` prefixes the param of a field nested in an object, e.g. "stream_options."."""
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(within + name, f"{within}{name} must be true or false, got {shown(value)}")
    return value


def integer(data: dict[str, Any], name: str, minimum: int | None, rule: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if not is_int(value) or (minimum is not None and value < minimum):
        raise invalid(name, f"{name} must be {rule}, got {shown(value)}")
    return value


def number(
    data: dict[str, Any], name: str, default: float, valid: Callable[[float], bool], rule: str,
) -> float:
    value = data.get(name)
    if value is None:
        return default
    if not is_number(value) or not valid(value):
        raise invalid(name, f"{name} must be {rule}, got {shown(value)}")
    return float(value)
