"""mtp-lab: a harness for multi-token-prediction ablations."""

__version__ = "0.1.0"
