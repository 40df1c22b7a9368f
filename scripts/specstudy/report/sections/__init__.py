"""The report's sections, in the report's order; each appends its blocks to the block list and says what
is missing when an input is.

- :mod:`.recommendation` — the decision, its rule, the patch, the rounds and the stability drivers;
- :mod:`.results` — the results per workload × concurrency and the plots;
- :mod:`.engines` — several engine builds: each build's own effect and each arm's speedup on each build;
- :mod:`.candidates` — the correctness gates, each candidate's wins, losses, cost and confounds;
- :mod:`.inputs` — the selection, the workloads' licences and token lengths, held-out acceptance;
- :mod:`.validity` — excluded cells, unservable configurations, network effects, drift;
- :mod:`.gpu` — GPU telemetry, start-up phases, memory and KV cost;
- :mod:`.method` — the explanatory model, the hypotheses, the statistical method;
- :mod:`.capacity` — the capacity knees, apart from the fixed-concurrency results;
- :mod:`.extensions` — the opt-in phases' own sections.
"""
