"""The study's phases' behaviour (docs/extensions.md); imports the layers up to ``analysis``.

Each phase is declared once in :mod:`specstudy.study.phase_decl` (target, kind, label, checks, the design
its plan records) and registers its behaviour once here (:mod:`.registry`: its deployment step, its
summary and report section, its own tools), so the deployment job and the command line iterate over the
registry instead of naming phases. Importing this package registers every phase.

- :mod:`.registry` — the :class:`~.registry.Phase` behaviour, :func:`~.registry.register_phase`, :func:`~.registry.get`;
- :mod:`.summary` — a phase's summary step: what ran (plan + records) -> the phase's summary, failures named;
- :mod:`.sampling` — the sampling phase (temperature > 0): sampled capture step, judges, summary, section;
- :mod:`.sampling_capture` — sampled captures against a live server, and their reader;
- :mod:`.sampling_judge` — the offline judge of sampled captures against a baseline-vs-baseline control;
- :mod:`.ignore_eos` — the fixed-length phase beside natural EOS;
- :mod:`.memory` — the memory phase (KV cost, advertised pool, no-preemption sweep);
- :mod:`.profile` — the kernel profile phase (engine traces under vLLM's torch profiler);
- :mod:`.cli` — ``specstudy phase summary <phase>`` and ``specstudy phase <phase> <tool>``.
"""

from specstudy.phases import ignore_eos, memory, profile, sampling  # noqa: F401  (each registers its phase)
from specstudy.phases.registry import Phase, get, names, register_phase

__all__ = ["Phase", "get", "names", "register_phase"]
