"""The GPU's memory-bound mechanics point on random weights (``specstudy mechanics``, rule
``decode_mechanics``), never pooled with a study; the top layer: it runs the deployment job of ``job``.

- :mod:`.point` — the point's config, its arms and their records.
"""
