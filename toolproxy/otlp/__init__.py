"""OpenTelemetry out: one span per recorded exchange, in the GenAI semantic conventions
(docs/export.md#opentelemetry)."""
