"""The EigenData library (EigenData §4): domain packs, the agents, dialogues, verification, self-evolution."""
