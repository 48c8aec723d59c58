"""Starting a trial's processes and ending them, as every executor does it.

Owns ``torchrun``'s command lines and the environment a trial's processes read (the
driver's side of the contract the ranks read back: :mod:`~trials.launch.launcher`),
the trial log's driver lines, the environment of a trial on a share of one slot and
whether CUDA MPS runs (:mod:`~trials.launch.shares`), and process identity: a pid with its
start time and the attempt's launch token, found and ended on this machine
(:mod:`~trials.launch.processes`).

May import ``storage``, the base modules of ``trials`` and :mod:`trials.scheduler`
(for types); the in-rank runtime, the node programs, the executors and the
coordination modules import it, never the reverse.
"""
