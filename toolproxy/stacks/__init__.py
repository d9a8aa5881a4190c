"""Serving stacks: each described once as data (catalog), fingerprinting, markers, advice and template checks."""
