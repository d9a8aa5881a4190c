"""Segments -> rows in DuckDB: each segment read in batches, each record classified (classify/)
in worker processes, the rows written with the offset they cover (pipeline); and whether a store
lags its segments (staleness)."""
