"""SFT track (ASTRA §2.1): tools.servers -> chains -> tasks -> trajectories -> trajectories.scored -> samples.sft."""
