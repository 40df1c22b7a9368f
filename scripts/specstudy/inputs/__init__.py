"""What a study is built from; imports ``core`` and ``inference``.

- :mod:`.corpus` — the workloads' prompt corpora (build, token statistics);
- :mod:`.heldout` — the fixture draft's acceptance on held-out text;
- :mod:`.fixture_models` — the tiny target/draft pair of the embedded default;
- :mod:`.scale_model` — that pair widened to an 8B/1B shape (the GPU scale-model study);
- :mod:`.rebuilt` — rebuilt models checked against a resumed study's packed records;
- :mod:`.random_model` — random-weights models for the mechanics point;
- :mod:`.arctic_build` — arctic-inference built into a directory of its own (suffix decoding);
- :mod:`.model_launch` — the pinned swiss-ai/model-launch example the recommendation is delivered against.
"""
