"""Everything that runs afterwards, on recordings: DuckDB store, ingest, reassembly, classification."""
