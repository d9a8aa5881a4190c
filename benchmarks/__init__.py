"""Benchmarks, run from a checkout (`python -m benchmarks.NAME`), never installed: `proxy` (requests
through the proxy against the bare upstream, nginx and a floor), `streams` (concurrent SSE
streams), `profiling` (where the proxy's CPU goes, for `proxy --profile`), `analyzer` (a timed
`analyze` over a synthetic data dir), `storage` (what content dedup saves and costs) and `export`
(Parquet export). The synthetic recordings they use are toolproxy.testing.corpus."""
