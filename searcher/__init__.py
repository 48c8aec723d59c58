"""slotsweep's searcher: experiment configs, the search space, the driver and the CLI.

Example:
    >>> from searcher import load_config
    >>> config = load_config("examples/digits/experiment.yaml")  # doctest: +SKIP
"""

from searcher.config import ConfigError, ExperimentConfig, load_config, parse_config

__all__ = ["ConfigError", "ExperimentConfig", "load_config", "parse_config"]
