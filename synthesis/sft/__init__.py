"""The SFT track's library (ASTRA §2.1): chain graphs, tool emulation, the agent loop, the 7-dimension reward."""
