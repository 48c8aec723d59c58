"""The search driver: one process per search, a tick pipeline over the database.

:class:`~searcher.driver.driver.SearchDriver` owns an experiment and runs its tick
(reap -> decide -> place -> launch): :mod:`~searcher.driver.control` (ownership,
heartbeat, Ctrl-C), :mod:`~searcher.driver.study_side` (Optuna's ask and tell),
:mod:`~searcher.driver.placement` (the pending queue and the scheduler's decisions),
:mod:`~searcher.driver.running` (the attempts running), :mod:`~searcher.driver.launching`
(starting them), :mod:`~searcher.driver.outcomes` and :mod:`~searcher.driver.failures`
(how an attempt ended and what follows), :mod:`~searcher.driver.decisions` (the plain
data between those stages), :mod:`~searcher.driver.warm` and
:mod:`~searcher.driver.handoff` (warm jobs and their next trials decided ahead),
:mod:`~searcher.driver.runtime_spec` (what each rank is told),
:mod:`~searcher.driver.progress` (the terminal's progress bar) and
:mod:`~searcher.driver.context` (what every stage shares).

May import the package's own modules, :mod:`searcher.integrations` and
:mod:`searcher.submit`; the API, the diagnosis and the CLI import this package, never
the reverse. Nothing is re-exported here (each caller imports the module it needs, so
the CLI's start-up stays cheap); ``searcher.SearchDriver`` is the public name.
"""
