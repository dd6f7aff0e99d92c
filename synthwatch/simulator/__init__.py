"""An OpenAI-compatible server shaped like vLLM >= 0.16 (demo, simulate, tests, benchmarks)."""
