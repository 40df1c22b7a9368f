"""One vLLM server's lifecycle, by concept; imports the layers up to ``measure``.

The deployment job that drives it is :func:`specstudy.job.run.run_deployment` (launch → ready → smoke
captures → cells → stop; its spec: :mod:`specstudy.job.spec`). What it calls lives here:

- :mod:`.command` — engine settings, arm validation, the vLLM argument list (``--speculative-config``
  is the only thing that differs between arms), and the recommended arm's ``--speculative-config``
  patched into an operator's launch arguments (for :mod:`specstudy.report.document`);
- :mod:`.launch` — backends (:class:`~.launch.LocalProcessBackend`, :class:`~.launch.ContainerBackend`
  for Clariden's ``srun --environment``), the :class:`~.launch.Server` handle, process-group stop,
  the launcher's environment and :func:`~.launch.start_server`;
- :mod:`.readiness` — :func:`~.readiness.wait_ready`, the :class:`~.readiness.IdleWatchdog`,
  :func:`~.readiness.stop_on_signals`;
- :mod:`.launchlog` — the engine's own log: confounds (:func:`~.launchlog.parse_launch_log`),
  start-up steps, error excerpts and failure classification;
- :mod:`.provenance` — git, image, bind mounts, Slurm, models, hardware and software of a deployment
  (the engine's version and commit from the server's own interpreter);
- :mod:`.filehash` — full sha256 of weights and images, computed once per (path, size, mtime) and
  cached across deployments;
- :mod:`.redaction` — secrets out of commands, environments, URLs and logs;
- :mod:`.records` — deployment ids and failure records (``results/deployment-failures/…``);
- :mod:`.watch` — notices a server's death mid-deployment.

``/metrics`` is fetched and parsed in one place, :mod:`specstudy.measure.prom`.
"""

from __future__ import annotations


class DeploymentError(RuntimeError):
    """A deployment could not be built, started or made ready; ``stage`` and ``reason`` classify it."""

    def __init__(self, message: str, *, stage: str = "start", reason: str = "error", exit_code: int | None = None):
        super().__init__(message)
        self.stage = stage
        self.reason = reason
        self.exit_code = exit_code

