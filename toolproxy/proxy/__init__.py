"""The proxy: an aiohttp server that forwards to one configured upstream and records everything.

To follow one request: `forward.py` drives a flow through its phases, `flow.py` defines them and
the `Addon` base; each concern is one addon (`auth`, `condition`, `stackwatch`, `counters`,
`pool`, `durability`, `recorder`); `state.py` is what a running proxy holds; `app.py` puts the
addons in order and runs the lifecycle.
"""
