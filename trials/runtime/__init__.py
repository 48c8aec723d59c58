"""The in-worker runtime: what user code meets inside every rank of a trial."""
