"""Rewards you can trust: verifiers, hack detectors, composite rewards, versions, the gold-set gate."""
