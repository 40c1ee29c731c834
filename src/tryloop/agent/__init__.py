"""Policies, tools and the multi-turn episode loop that records token-exact trajectories."""
