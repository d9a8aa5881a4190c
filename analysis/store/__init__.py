"""The DuckDB store: its connection, its numbered migrations, and its tables and columns declared once."""
