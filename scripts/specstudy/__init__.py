"""specstudy: decide, with evidence, whether speculative decoding should be enabled for a vLLM deployment.

The package is layered; each subpackage's ``__init__`` says what lives there. A module imports its own
layer and the layers before it in :data:`LAYERS`, never one after it, and no import circle exists
(tests/test_layers.py reads every import, top-level and inside functions). The modules directly
under ``specstudy/`` (the command line) stand above every layer; this file imports nothing.
"""

__version__ = "0.1.0"

#: The layers, lowest first (docs/DESIGN.md, "Layers").
LAYERS = (
    "core",        # errors, atomic files, schemas, records, arms: the shapes every layer shares
    "inference",   # pure statistics: intervals, effects, the pre-registered decision rule, its simulation
    "inputs",      # what a study is built from: corpora, held-out text, fixture/scale/random models, upstream data
    "study",       # what is to run, checked before anything runs: config, pre-registration, plan, cost
    "measure",     # one cell against a live server: load generator, /metrics, telemetry, capacity search
    "deployment",  # one vLLM server's lifecycle: command, launch, readiness, launch log, provenance
    "analysis",    # results read and judged: tables, gates, selection, checkpoint, confounds
    "phases",      # the opt-in phases after the greedy core: sampling, ignore_eos, memory, profile
    "job",         # the deployment job: its spec and its run (launch -> cells -> stop)
    "report",      # the report: sections, plots, explanatory models
    "mechanics",   # the random-weights mechanics point, never pooled with a study
)
