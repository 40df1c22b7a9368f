"""Results read and judged; imports the layers up to ``deployment``.

- :mod:`.tables` — the results tree as Parquet tables;
- :mod:`.gate` — the correctness gate over greedy captures (comparisons, controls, verdicts); :mod:`.gate_cli`
  its command line (``specstudy gate``);
- :mod:`.select` — the pre-registered selection of confirmation arms and the final candidate;
- :mod:`.checkpoint` — the confirmation's checkpoint after each round, its archive and show;
- :mod:`.capacity_criteria` — the capacity half of the recommendation;
- :mod:`.jit` — Triton JIT compilations inside a cell's window (a confound);
- :mod:`.upstream` and :mod:`.upstream_confirm` — the upstream study's raw cells imported, and its
  8B confirmation judged by this study's rule;
- :mod:`.check_results` and :mod:`.stale` — a results tree's consistency and its repair; a report built
  from a missing checkpoint output moved aside.
"""
