"""Coordination across searches, in the database: what every driver of one cluster shares.

Owns the slot ledger (:mod:`~trials.coordination.allocations`: leased claims, so two
searches never hold one slot), the cluster-wide queue and its placement decisions
(:mod:`~trials.coordination.cluster_queue`), warm jobs and their hand-over
(:mod:`~trials.coordination.warm_jobs`), the end of a trial's attempts through the
executor that started them (:mod:`~trials.coordination.attempts`), and pause, activate
and kill as the CLI and the UI ask for them (:mod:`~trials.coordination.control`).

May import ``storage``, the base modules of ``trials``, :mod:`trials.scheduler`,
:mod:`trials.launch` and :mod:`trials.executors`; in ``trials`` only the read model,
:mod:`trials.queries`, imports it.
Its modules import each other by their full path, never through this package.
"""
