"""From a config to a validated, created experiment: what ``run``, ``resume`` and
``continue`` check and write before a driver starts.

- :mod:`~searcher.submit.space`: the search space as Optuna distributions;
- :mod:`~searcher.submit.samplers`: the sampler, the pruner and the study's directions;
- :mod:`~searcher.submit.preflight`: the entrypoint resolved in a child process;
- :mod:`~searcher.submit.relocation`: a search's folders moved to another machine;
- :mod:`~searcher.submit.creation`: the experiment's row and its Optuna study;
- :mod:`~searcher.submit.submission`: all of it for one run, every problem at once.

May import the package's own modules (:mod:`searcher.experiments`,
:mod:`searcher.logs`) and :mod:`searcher.integrations`; the driver, the diagnosis, the
API and the CLI import this package, never the reverse. Nothing is re-exported here:
``slotsweep --help`` and a config error must not pay for Optuna, so each caller imports
the module it needs (the package's public names are :mod:`searcher`'s).
"""
