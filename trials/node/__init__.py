"""The programs a trial's processes run on each node: the ``torchrun`` wrapper and the rank.

``python -m trials.node.torchrun`` runs ``torchrun`` in-process and prefixes its
lines with ``[torchrun] `` (:mod:`~trials.node.torchrun`); every rank it starts runs
``python -m trials.node.worker`` (:mod:`~trials.node.worker`), which routes its output
through ``[rank N] `` prefixing before it imports torch, then hands over to
:mod:`trials.runtime`.

May import ``storage`` (lazily), the base modules of ``trials``, :mod:`trials.launch`
(the environment it reads) and :mod:`trials.runtime`; only the executors import it
(a Slurm node runs the wrapper). This ``__init__`` imports nothing, so a rank's first
import stays small.
"""
