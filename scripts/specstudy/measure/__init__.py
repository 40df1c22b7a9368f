"""One cell measured against a live server; imports the layers up to ``study``.

- :mod:`.loadgen` — the asyncio client (closed and open loop);
- :mod:`.prom` — the one ``/metrics`` fetch and parse: counter deltas, gauges, KV-cache config;
- :mod:`.telemetry` — the sampler of gauges, processes and GPUs;
- :mod:`.cell` — one cell: warm-up, snapshots, run, summary, validity;
- :mod:`.greedy_capture` — the correctness gate's greedy capture of the smoke prompts;
- :mod:`.capacity` — the open-loop rate search and its knee (a package: settings, step, search, runner, knee, plot, run, CLI);
- :mod:`.progress` — the live progress lines of a deployment job.

A server is started elsewhere (``specstudy.deployment``); here only its URL is known.
"""
