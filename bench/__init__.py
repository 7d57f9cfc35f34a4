"""Benchmarks: a seeded dev-like workload (bench.workload) and the engine benchmark (bench.gpu_engine)."""
