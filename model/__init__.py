"""The reference model: an independent, deliberately plain reading of ``specs/``."""
