"""The benchmark scripts import their sibling ``_common`` module, as when run directly."""

from __future__ import annotations

import sys

from tests.conftest import REPO_ROOT

if str(REPO_ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "bench"))
