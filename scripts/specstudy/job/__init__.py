"""The deployment job: one (phase, arm, rep) from its spec to its records; imports every layer below.

- :mod:`.spec` — a deployment job's spec from the plan and the config, engine settings, cell fingerprints;
- :mod:`.run` — the job: launch → ready → smoke captures → cells (and the phases' steps) → stop;
- :mod:`.engine_probe` — ``specstudy engine probe-methods``: one real server per speculative method;
- :mod:`.cli` — ``specstudy deploy-command`` and ``specstudy deploy-confounds``.
"""
