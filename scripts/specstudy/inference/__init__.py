"""Pure statistics: numbers and declarations in, plain dicts out; imports only ``core``.

- :mod:`.intervals` — the t and bootstrap intervals of a geometric mean;
- :mod:`.stats` — deployment-level effects (paired comparisons), drift, the explanatory model, hypotheses;
- :mod:`.decision` — the pre-registered decision rule: its checks, cell verdicts, adaptive confirmation,
  stability and the recommendation (:func:`.decision.recommend`);
- :mod:`.simulate` — noise scenarios, interval coverage, the rule's operating characteristics.

The study layer checks a pre-registration against these (``specstudy.study.prereg``); nothing here reads a file.
"""
