"""Builders the tests use; never imported by the proxy. (The emulated stacks, which the demo needs too, are
`toolproxy.emulators`.)"""
