"""Workloads: trace loading, rate scaling and slicing."""
