"""The rank side: checkpoints, the flight recorder, causes, the rank environment."""
