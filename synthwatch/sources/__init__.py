"""Where records come from: datasets loaded into a run, another generator's output followed or imported."""
