"""tryloop: agent reinforcement learning in verifiable environments."""

__version__ = "0.1.0"
