"""The study's report; imports every layer up to ``job``.

- :mod:`.document` — the report built: its table of contents of sections; :mod:`.cli` — ``specstudy report``;
- :mod:`.files` — every file the report reads, named, and the one loader that finds them under a results root;
- :mod:`.sections` — the report's sections, one module per part of the report;
- :mod:`.blocks` — the report as blocks, rendered to Markdown and self-contained HTML;
- :mod:`.plots` — matplotlib off-screen, atomic PNGs, the caption of every plot, the report's figures;
- :mod:`.efficiency` — energy per output token, the throughput–interactivity curves;
- :mod:`.costmodel` — the explanatory cost model (step split, predicted speedup, break-even acceptance);
- :mod:`.model_launch` — the model-launch deliverable: the example's patch and the pull request's text.
"""
