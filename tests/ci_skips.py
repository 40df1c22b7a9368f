"""Under ``CI=true`` a skipped test is a failed test: a missing prerequisite must fail the run.

CI (``bash .ci/run`` -> ``make test``) installs everything the suite needs on a clean machine, so a
test that skips there means an install silently failed. That holds for a skip at run time, in a
fixture, from a ``skipif`` mark, and at collection time (``pytest.skip(allow_module_level=True)``, a
module-level ``pytest.importorskip``): a module that skips whole fails its collection. Exceptions:
expected failures, and a test marked ``gpu`` skipped because the machine has no GPU (its reason starts
with :data:`NO_GPU`, as ``tests/conftest.py`` words it); a ``gpu`` test skipped for any other reason
fails like any other. Outside CI a skip stays a skip and pytest's ``-ra`` lists its reason.
Registered by ``tests/conftest.py``; usable on its own with ``pytest -p ci_skips``.
"""

from __future__ import annotations

import os

import pytest

#: The one skip reason CI accepts, and only for a test marked ``gpu``: CI has no GPU.
NO_GPU = "gpu test: no NVIDIA GPU"

FIX = ("CI installs every prerequisite; fix the install (see `make test`), or, for a test that needs a GPU, mark it "
       f"gpu (skipped only with a reason starting {NO_GPU!r}).")


def ci_enabled() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _reason(longrepr) -> str:
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def allowed_skip(item, reason: str) -> bool:
    """A ``gpu`` test skipped because there is no GPU."""
    return item.get_closest_marker("gpu") is not None and reason.startswith(NO_GPU)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and ci_enabled()) or hasattr(report, "wasxfail"):
        return
    reason = _reason(report.longrepr)
    if allowed_skip(item, reason):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, which counts as a failure: {reason}\n{FIX}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module (or class) skipped while collecting: no test of it runs, so CI must not pass quietly."""
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and ci_enabled()):
        return
    report.outcome = "failed"
    report.longrepr = (f"{collector.nodeid}: skipped at collection under CI=true, which counts as a failure: "
                       f"{_reason(report.longrepr)}\n{FIX}")
