"""The SFT track's LLM roles: chains, tasks, tool emulation, trajectory judges."""
