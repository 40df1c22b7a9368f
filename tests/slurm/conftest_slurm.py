"""Pytest fixtures for a real one-node Slurm (see tests/slurm/cluster.py and docs/slurm.md).

Import into tests/conftest.py (or a test module)::

    from slurm.conftest_slurm import local_slurm, slurm_env  # noqa: F401

``local_slurm`` (session): the running :class:`slurm.cluster.LocalSlurm` — ``.env``, ``.conf``,
``.nodename``, ``.cpus``, ``.mem_mib``, ``.partition``, ``.root``, ``.logs_tail()``.
``slurm_env`` (session): ``dict`` environment for subprocesses (``os.environ`` + ``SLURM_CONF``);
pass it as ``env=`` to ``snakemake``/``sbatch``/``squeue``.

Both skip the test, with the reason, only when Slurm is not installed (or not root); a cluster that
is installed but does not start is an error, not a skip. The cluster is started once per pytest
process (shared even when this module is imported in several places) and stopped at session end.
"""

from __future__ import annotations

import pytest

from slurm import cluster as _cluster


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory):
    why = _cluster.unavailable_reason()
    if why:
        pytest.skip(f"local Slurm unavailable: {why}")
    c = _cluster.acquire(tmp_path_factory.mktemp("slurm-cluster"))
    try:
        yield c
    finally:
        _cluster.release()


@pytest.fixture(scope="session")
def slurm_env(local_slurm) -> dict[str, str]:
    return dict(local_slurm.env)
