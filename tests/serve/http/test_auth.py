"""Where the API key comes from, in order, and how a header is matched against it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tropical.serve.http.auth import key_matches, resolve_api_key


def test_the_flag_wins_then_the_file_then_tropicals_variable_then_vllms(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    both = {"TROPICAL_API_KEY": "ours", "VLLM_API_KEY": "vllm"}
    assert resolve_api_key("flag", None, both) == "flag"
    assert resolve_api_key(None, str(key_file), both) == "from-file"
    assert resolve_api_key(None, None, both) == "ours"
    assert resolve_api_key(None, None, {"VLLM_API_KEY": "vllm"}) == "vllm"
    assert resolve_api_key(None, None, {"VLLM_API_KEY": ""}) is None


def test_an_empty_or_doubled_key_source_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        resolve_api_key(None, str(empty), {})
    with pytest.raises(ValueError, match="not both"):
        resolve_api_key("k", str(empty), {})


def test_only_the_exact_bearer_token_matches() -> None:
    assert key_matches("s3cret", "Bearer s3cret")
    for header in ("", "Bearer s3cre", "Bearer s3cret ", "bearer s3cret", "s3cret"):
        assert not key_matches("s3cret", header)
