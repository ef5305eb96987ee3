"""Role definitions (typed input, typed output, prompt) grouped by stage."""
