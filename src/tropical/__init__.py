"""Tropical: SLO-aware prefill/decode multiplexing for LLM serving."""
