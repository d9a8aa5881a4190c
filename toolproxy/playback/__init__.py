"""`toolproxy playback`: a recorded run served back to a harness, offline and in order.

fixture loads a run's exchanges from the data directory's segments; match decides which recorded
exchange answers a request (and, on a miss, which one came closest and where it differs); server
is the aiohttp app on the proxy's protocol surface; cli is the command.
"""
