"""Tropical: SLO-aware prefill/decode multiplexing for LLM serving."""

from tropical.native import activate

activate(__path__)
