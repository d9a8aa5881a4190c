"""Moving the analysis out of the DuckDB file: columnar files other engines read (Parquet)."""
