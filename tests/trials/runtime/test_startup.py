"""Start-up cost: what a rank imports before the user's code runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT


@pytest.mark.slow
def test_the_runtime_imports_neither_optuna_nor_sqlalchemy_nor_streamlit() -> None:
    code = (
        "import sys, json\n"
        "import trials.node.worker, trials.runtime, trials.runtime._runner, trials.runtime._loop\n"
        "import trials.runtime._ddp, trials.runtime._recorder\n"
        "print(json.dumps(sorted(m for m in ('optuna', 'sqlalchemy', 'streamlit', 'storage',\n"
        "    'searcher', 'ui', 'pytorch_optimizer') if m in sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []
