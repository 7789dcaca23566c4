"""HeteroAuto: cost and memory model, plan search (h2 baseline and auto), simulator, profiler."""
