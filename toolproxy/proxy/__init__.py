"""The wire: an aiohttp server that forwards to one configured upstream and records everything."""
