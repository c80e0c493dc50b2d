"""Observability shared by the three processes: logs in text or JSON lines (:mod:`.logs`), the
Prometheus metrics every process serves (:mod:`.metrics`), the pages' short time series
(:mod:`.series`) and OpenTelemetry tracing (:mod:`.tracing`).
"""
