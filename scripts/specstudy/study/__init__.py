"""What is to run, declared and checked before anything runs; imports ``core``, ``inference``, ``inputs``.

- :mod:`.config` — the study config: load, schema, cross-field checks, the effective-config files;
- :mod:`.prereg` — the pre-registration: its file read and every section checked;
- :mod:`.prereg_guard` — the pre-registration lock, checked at every parse;
- :mod:`.selection_lock` — the selection locked by the confirmation plan, and its verification;
- :mod:`.template_args` — per-workload chat-template switches;
- :mod:`.phase_decl` — every phase declared once (core and opt-in): target, kind, label, checks, design;
- :mod:`.engine_methods` — the recorded probe of which speculative methods the engine serves;
- :mod:`.methods_cli` — ``specstudy methods``: the registered methods (``core.methods``), the probe's word on
  each, and the record schemas' method lists generated from the registry;
- :mod:`.plan` — the factorial of deployments and cells, and their counterbalanced order;
- :mod:`.cost` and :mod:`.duty` — the study's cost preview and the duty cycle it is estimated from;
- :mod:`.plan_cli` — ``specstudy plan`` and ``specstudy prereg-lock`` (plan, lock, ``--cost``; listed in ``specstudy.cli.SUBCOMMANDS``);
- :mod:`.checkconfig`, :mod:`.preflight`, :mod:`.snakemake_preflight`, :mod:`.rerun` — ``check-config``,
  the workflow's preflight, a raw ``snakemake`` command line's config files and targets, ``specstudy rerun``.
"""
