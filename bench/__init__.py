"""Benchmarks: scripts run by hand, not tests (see bench/README.md)."""
