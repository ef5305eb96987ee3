"""Environment track (ASTRA §2.2): qa.seeds -> qa.traces -> qa.validated -> envs.code -> envs.verified -> samples.verified."""
