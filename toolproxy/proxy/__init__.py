"""The proxy: an aiohttp server that forwards to one configured upstream and records everything.

To follow one request: `forward.py` drives a flow through its phases, `flow.py` defines them and
the `Addon` base; each concern is one addon (`auth`, `condition`, `stackwatch`, `counters`,
`pool`, `durability`, `recorder`), and the parts from the folders below (the writer, the live
page, the OTLP shipper) are addons through `parts.py`; `addons.py` puts them in order; `state.py`
is what a running proxy holds; `app.py` runs the lifecycle; `admin.py` answers /_toolproxy/.
"""
