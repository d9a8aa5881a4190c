"""Serving stacks: their known behaviour as data, fingerprinting, and the fakes tests run against."""
