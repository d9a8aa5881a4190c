"""Segments -> rows in DuckDB: each segment's lines read in batches and each record classified
(classify/) in worker processes (lines), the rows written with the offset they cover (pipeline);
and whether a store lags its segments (staleness)."""
