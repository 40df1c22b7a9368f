"""Under ``CI=true`` a skipped test is a failed test: a missing prerequisite must fail the run.

CI (``bash .ci/run`` -> ``make test``) installs everything the suite needs on a clean machine, so a
test that skips there means an install silently failed. Exceptions: tests marked ``gpu`` (CI has no
GPU) and expected failures. Outside CI a skip stays a skip and pytest's ``-ra`` lists its reason.
Registered by ``tests/conftest.py``; usable on its own with ``pytest -p ci_skips``.
"""

from __future__ import annotations

import os

import pytest

ALLOWED_MARKERS = ("gpu",)


def ci_enabled() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and ci_enabled()) or hasattr(report, "wasxfail"):
        return
    if any(item.get_closest_marker(m) for m in ALLOWED_MARKERS):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true, which counts as a failure: {reason}\n"
                       "CI installs every prerequisite; fix the install (see `make test`) or mark the test "
                       f"{' / '.join(ALLOWED_MARKERS)} if it needs hardware CI does not have.")
