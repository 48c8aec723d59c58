"""The script each rank runs when forked from its ``torchrun`` wrapper (``--run-path``).

:mod:`trials.node.torchrun` starts ranks with torchrun's ``--start-method=fork
--run-path`` and this file as the training script: torchrun runs it as ``__main__``
(``runpy.run_path``) in a child forked from the agent, which has imported torch already.
"""

from trials.node.worker import run_forked

if __name__ == "__main__":
    run_forked()
