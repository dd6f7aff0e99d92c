"""The database: engine and schema, the queue SQL every process shares, config versions, the search index."""
