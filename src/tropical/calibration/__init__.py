"""Calibration of the latency model against measured per-op profiles."""
