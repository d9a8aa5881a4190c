"""Emulated serving stacks and other test doubles: used by the tests and the demo, never by the proxy."""
