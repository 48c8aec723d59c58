"""The programs a trial's processes run on each node: the ``torchrun`` wrapper and the rank.

``python -m trials.node.torchrun`` runs ``torchrun`` in-process and prefixes its
lines with ``[torchrun] `` (:mod:`~trials.node.torchrun`); every rank it starts, forked
from it with torch already imported, runs :mod:`~trials.node.worker` (a plain
``torchrun ... -m trials.node.worker`` works too), which routes its output through
``[rank N] `` prefixing, then hands over to :mod:`trials.runtime`. On a node of a
multi-node attempt (a Slurm step, a Ray node's actor) ``python -m
trials.node.cluster_node`` sets that node's part up first
(:mod:`~trials.node.cluster_node`); on Ray, the actors of :mod:`~trials.node.ray_actors`
start it. They live here, not in :mod:`trials.executors`, because the node imports
them: a module there would import every executor (SQLAlchemy, the Slurm and Ray
clients' code) before ``torchrun`` starts. The wrapper passes the attempt's fenced
start once for the node's ranks, beside its own start-up (:mod:`~trials.node._fence`),
and both keep the garbage collector off torch's import (:mod:`~trials.node._heap`).

May import ``storage`` (lazily), the base modules of ``trials``, :mod:`trials.launch`
(the environment it reads) and :mod:`trials.runtime`; only the executors import it
(a Slurm node runs the wrapper). This ``__init__`` imports nothing, so a rank's first
import stays small.
"""
