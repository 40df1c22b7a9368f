"""The opt-in phases after the greedy core (docs/extensions.md); imports the layers up to ``analysis``.

- :mod:`.sampling` — sampled captures against a server and their judge against a baseline control;
- :mod:`.sampling_phase` — the sampling phase's summary, report section and ``specstudy sampling``;
- :mod:`.ignore_eos` — the fixed-length phase beside natural EOS;
- :mod:`.memory` — the memory phase (KV capacity and its steps);
- :mod:`.profile` — the ``profile`` phase (engine traces);
- :mod:`.extension_cli` — ``specstudy extension gate|summary`` from a phase's plan and records.
"""
