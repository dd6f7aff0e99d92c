"""Reading records: random samples, filters, full-text search, flags."""
