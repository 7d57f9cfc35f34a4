"""Observability: Prometheus metrics, health endpoints, tracing, logs."""
