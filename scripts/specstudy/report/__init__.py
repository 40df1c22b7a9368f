"""The study's report; imports every layer up to ``job``.

- :mod:`.document` — the report's sections, Markdown and HTML (``specstudy report``);
- :mod:`.plots` — matplotlib off-screen, atomic PNGs, the caption of every plot;
- :mod:`.efficiency` — energy per output token, the throughput–interactivity curves;
- :mod:`.costmodel` — the explanatory cost model (step split, predicted speedup, break-even acceptance).
"""
