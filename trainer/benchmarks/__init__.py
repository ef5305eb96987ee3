"""Public benchmarks: evaluate any OpenAI-compatible endpoint on tau2-bench and BFCL."""
