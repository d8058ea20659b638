"""What operators and their tools read: probes, metrics, log lines.

- `health`: /healthz and /readyz, for load balancers and orchestrators.
- `metrics`: /metrics in Prometheus text format, and the per-process stream counter.
- `logs`: the log formatter that escapes control characters, so a log line cannot be forged.

The URLconf and the logging settings name these; apps import only `metrics.CountedStream`.
"""
