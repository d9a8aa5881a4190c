"""OpenTelemetry out: one span per recorded exchange, in the GenAI semantic conventions (README: "OpenTelemetry")."""
