"""The shapes every layer shares; imports nothing of specstudy outside ``core``.

- :mod:`.errors` — the bad-input errors (``UserError``, ``ConfigError``), each naming file, field and fix;
- :mod:`.atomic` — atomic writes, the one JSON reader and the file hasher;
- :mod:`.schemas` — the JSON schemas under ``config/schemas/`` and their validation;
- :mod:`.records` — typed result records and their one reader each (docs/DESIGN.md, "Records in code");
- :mod:`.methods` — the registry of speculative methods: each declared once (arm grammar, speculative config,
  required model directory, forbidden combinations, probe entry, launch-log confounds);
- :mod:`.arms` — arm names, their parser and the wildcard pattern (built from the registry);
- :mod:`.layout` — the results-path layout: every path under ``results/`` built and parsed in one place;
- :mod:`.integrity` — the seal on a cell summary and the check of the files it names;
- :mod:`.content` — what a published record's content is (a re-run writes only what changed);
- :mod:`.studyyaml` — the study's YAML reader (duplicate keys, non-finite numbers named by line);
- :mod:`.stat_util` — the one percentile and median, and the finite-number helper;
- :mod:`.timestamps` — the one stamp format of records (UTC, ISO 8601, milliseconds, `Z`) and its reader.
"""
