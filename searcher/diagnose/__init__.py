"""Is this search healthy, and why is it slow: checks that run a config or read a database.

- :mod:`~searcher.diagnose.smoke`: ``slotsweep run --test``, Determined's test mode: one
  short trial end to end (train, validate, checkpoint, restore) before a search spends
  hours;
- :mod:`~searcher.diagnose.probes`: ``slotsweep diagnose``, short probes of the trial
  with one thing changed each, placed and driven as real trials;
- :mod:`~searcher.diagnose.diagnosis`: what the probes' timings conclude (pure);
- :mod:`~searcher.diagnose.consistency`: the database and Optuna's study checked against
  each other after any crash.

May import the package's own modules, :mod:`searcher.submit` and :mod:`searcher.driver`;
only the CLI imports this package. Nothing is re-exported here (the CLI imports a
module when its command runs); ``searcher.check_consistency`` is the public name.
"""
