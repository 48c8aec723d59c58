"""The ``slotsweep`` command line: the commands, their tables, and ``python -m searcher.cli``.

- :mod:`~searcher.cli.commands`: the parser and every command (:func:`main`, the
  console script);
- :mod:`~searcher.cli.tables`: what ``list``, ``describe``, ``task list`` and
  ``agents`` print, as rows and as rich tables;
- :mod:`~searcher.cli.diagnose`: ``slotsweep diagnose``'s arguments and exit codes;
- :mod:`~searcher.cli.exports`: ``slotsweep tensorboard`` and ``slotsweep export mlflow``.

The top of the house: may import every other part of :mod:`searcher`, and nothing
imports it. Commands import what they run when they run, so ``slotsweep --help`` and a
config error stay cheap.
"""

from searcher.cli.commands import main

__all__ = ["main"]
