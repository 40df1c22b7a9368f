"""Capacity: the sustainable open-loop request rate of one arm under declared gates.

The question differs from the fixed-concurrency cells: *how many requests per second can this
deployment take (Poisson arrivals) while meeting the latency/error/backlog gates?* Results live
under ``results/capacity/<arm>/`` and are never mixed with cell summaries.

Algorithm (see ``docs/capacity.md``):

1. ``gates.json`` is written before the first step (gates and search settings as resolved).
2. *Bracket*: rate ``r = start`` and ``r *= growth`` while the step passes (up to ``max_rate_rps``);
   if the start rate fails, ``r /= growth`` down to ``min_rate_rps`` until a step passes.
3. *Bisect* geometrically between the highest pass ``lo`` and the lowest failing/limited rate ``hi``
   until ``(hi - lo)/lo <= resolution_frac``. The knee is ``lo``.
4. A step whose load-generator gates fail is ``client_limited``: it says nothing about the server
   and bounds the search as the *client ceiling*, never as server saturation. A knee above the
   proven client capacity (configured, or the highest rate the client drove without limitation)
   is refused.
5. *Confirmation*: ``soak.count`` soaks of ``soak.duration_s`` at the knee, then at the step above
   (``hi``), on the same deployment. A rate is *sustained* when every soak there passes the server
   gates; the knee stands (``confirmed``) when the knee is sustained and the step above is not (at
   least one soak fails). When they disagree the knee moves by one step, at most ``soak.max_moves``
   times: down (the failed knee becomes the step above, its soaks reused) or up (the sustained step
   above becomes the knee). Client-limited soaks stop the confirmation.

The search logic (:func:`~.rate_search.search`) only needs ``step_runner(rate) -> StepResult``; the real runner
(:func:`~.runner.make_step_runner`) drives :func:`specstudy.measure.loadgen.run_open_loop` and samples
``/metrics``. The modules, in the procedure's order:

- :mod:`.settings` — the declared gates and search settings (defaults, schemas), the records' schema names;
- :mod:`.step` — one step's result, its verdict under the gates, its record;
- :mod:`.rate_search` — bracket, bisect, classify, confirm with soaks (pure);
- :mod:`.runner` — measuring one step against a server (open loop, ``/metrics`` sampler, summary);
- :mod:`.knee` — the knee record read back: the deployment's summary in it, two arms' knees compared;
- :mod:`.plot` — ``capacity.png``;
- :mod:`.run` — one arm's search against a running server, recorded in its capacity folder;
- :mod:`.cli` — ``specstudy capacity {search,compare,plot}``.
"""

from specstudy.measure.capacity.knee import compare_knees as compare_knees
from specstudy.measure.capacity.plot import plot_capacity as plot_capacity
from specstudy.measure.capacity.rate_search import SearchOutcome as SearchOutcome
from specstudy.measure.capacity.rate_search import search as search
from specstudy.measure.capacity.run import run_capacity as run_capacity
from specstudy.measure.capacity.runner import make_step_runner as make_step_runner
from specstudy.measure.capacity.runner import summarize_step as summarize_step
from specstudy.measure.capacity.settings import resolve_gates as resolve_gates
from specstudy.measure.capacity.settings import resolve_search as resolve_search
from specstudy.measure.capacity.step import StepResult as StepResult
from specstudy.measure.capacity.step import judge as judge

__all__ = ["StepResult", "SearchOutcome", "judge", "search", "run_capacity", "compare_knees", "make_step_runner",
           "summarize_step", "plot_capacity", "resolve_gates", "resolve_search"]
