"""The record path: event schema and validation, the DuckDB store, ingestion front
ends, mergeable aggregates, Prometheus metrics and OpenTelemetry spans.
"""
