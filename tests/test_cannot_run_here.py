"""The suite's own rule for tests a machine cannot run: skipped with why, failed under CI."""

from __future__ import annotations

import pytest

from tests.conftest import CI_ENV_VAR, cannot_run_here

MISSING = "mounting a tmpfs (a disk that fills up) needs root"


@pytest.mark.parametrize("value", ["", "false", "0"])
def test_elsewhere_it_is_a_skip_saying_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(CI_ENV_VAR, value)
    with pytest.raises(pytest.skip.Exception) as skipped:
        cannot_run_here(MISSING)
    assert skipped.value.msg == MISSING


@pytest.mark.parametrize("value", ["true", "TRUE", "1"])
def test_under_ci_it_is_a_failure_naming_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(CI_ENV_VAR, value)
    with pytest.raises(pytest.fail.Exception) as failed:
        cannot_run_here(MISSING)
    assert failed.value.msg == f"CI=true, yet this test cannot run here: {MISSING}"
    assert not failed.value.pytrace
