"""Worker side: HTTP client, SSE parsing, endpoint pool, engine, writer thread."""
