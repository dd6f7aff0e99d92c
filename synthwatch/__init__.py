"""synthwatch: generate synthetic LLM training data and watch it being made."""
