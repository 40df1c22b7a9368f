"""Result records: the one place that knows where a field lives in a record written by this package.

Typed records (msgspec Structs mirroring ``config/schemas/``) and their readers: :class:`CellSummary`
(:func:`read_cell_summary`), :class:`DeploymentRecord` (:func:`read_deployment`, for ``deployment.json``
and ``failure.json``), :class:`GateRecord` (:func:`read_gate`) and :class:`SelectionRecord`
(:func:`read_selection`), :class:`SamplingGateRecord` (:func:`read_sampling_gate`), the capacity search's :class:`CapacityStep` (:func:`read_capacity_steps`, rows of
``steps.jsonl``/``soaks.jsonl``) and :class:`CapacityKnee` (:func:`read_knee`), and the :class:`Plan`
(:func:`read_plan`); see "Typed records" below.

KV capacity
-----------
A deployment record (``deployment.json``, schema ``deployment``) carries the engine's KV pool twice:

- ``"metrics"``: ``cache_config``, the labels of ``vllm:cache_config_info`` scraped from ``/metrics`` once the
  server is ready (``measure.prom.kv_cache_config``): ``kv_cache_tokens`` (vLLM's ``kv_cache_size_tokens``
  label, else ``num_gpu_blocks × block_size``);
- ``"log"``: ``confounds.kv_cache.tokens``, the launch log's ``GPU KV cache size: N tokens``
  (``deployment.launchlog.parse_launch_log``).

They agree for a model with one KV-cache group; the report shows both (the tables' ``kv_cache_tokens`` and
``kv_log_tokens``). :func:`kv_cache_tokens` reads them in the order its caller asks for: the tables and the
selection use ``/metrics``; the capacity knee prefers the launch log. A capacity knee's ``deployment`` (a
summary of the record, ``capacity.deployment_summary``) keeps both sections, so the same reader serves it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from specstudy.core.errors import UserError

KV_SOURCES = ("metrics", "log")


def number(v: Any) -> float | None:
    """A finite float from a number or numeric string; ``None`` for anything else (booleans included)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        f = float(v)
    elif isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


def _section(record: dict, key: str) -> dict:
    v = record.get(key)
    return v if isinstance(v, dict) else {}


def kv_cache_tokens(record: DeploymentRecord | dict | None, sources: Sequence[str] = ("metrics",)) -> float | None:
    """The KV pool in tokens of a deployment record (or a knee's deployment summary) from the first of
    ``sources`` (``"metrics"``, ``"log"``; see the module docstring) that has it; ``None`` when none has."""
    if isinstance(record, DeploymentRecord):
        record = {"confounds": record.confounds, "cache_config": record.cache_config}
    if not isinstance(record, dict):
        return None
    for source in sources:
        if source == "metrics":
            cc = _section(record, "cache_config")
            tokens = number(cc.get("kv_cache_tokens"))
            if tokens is None:
                blocks, size = number(cc.get("num_gpu_blocks")), number(cc.get("block_size"))
                tokens = blocks * size if blocks is not None and size is not None else None
        elif source == "log":
            tokens = number(_section(_section(record, "confounds"), "kv_cache").get("tokens"))
        else:
            raise ValueError(f"KV source must be one of {KV_SOURCES}, got {source!r}")
        if tokens is not None:
            return tokens
    return None


# ---------------------------------------------------------------------------------------------------------
# Typed records
# ---------------------------------------------------------------------------------------------------------
# msgspec Structs mirroring config/schemas/<name>.schema.json: the fields the package reads are typed; open
# sections (telemetry, confounds, cache_config, provenance, ...) stay mappings and flow through as written.
# Decoding is lax only where JSON cannot say more (``"4"`` -> 4); a record of another shape is an error that
# names the file and the field, never a silent default.

Json = dict[str, Any]
Num = int | float  # a JSON number kept as written (an int stays an int when re-encoded)


class RecordError(UserError):
    """A record file is not valid JSON or not of its schema's shape; the message names file and field."""


class Reason(msgspec.Struct):
    code: str
    detail: str


class Validity(msgspec.Struct):
    valid: bool
    reasons: list[Reason]
    throughput_valid: bool
    latency_valid: bool
    notes: list[Reason] = []
    tpot_valid: bool | None = None


class CellKeys(msgspec.Struct):
    phase: str
    arm: str
    method: str
    num_speculative_tokens: int | None
    draft_tensor_parallel_size: int | None
    rep: int
    workload: str
    concurrency: int
    deployment_id: str | None
    tensor_parallel_size: int | None = None
    kind: str | None = None  # repeat | drift | upstream
    rep_label: str | None = None  # the <rep> path component: rep<n> or drift<n>
    chat_template_kwargs: dict | None = None  # the workload's chat-template switch (docs/thinking.md); absent: none


class Corpus(msgspec.Struct):
    name: str | None
    version: str | int | None
    digest: str | None


class Requests(msgspec.Struct):
    attempted: int
    successful: int
    failed: int
    success_rate: float | None
    missing_usage: int


class Tokens(msgspec.Struct):
    prompt: int
    completion: int
    output_tokens_per_second: float | None


class Dist(msgspec.Struct):
    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None


class Speculative(msgspec.Struct):
    enabled: bool | None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position: dict[str, float | None] | None = None  # {"0": rate at draft position 0, ...}

    def per_position_rates(self) -> list[float | None] | None:
        """The per-position acceptance rates in position order."""
        if self.per_position is None:
            return None
        return [self.per_position[k] for k in sorted(self.per_position, key=int)]


class CellTimes(msgspec.Struct):
    started_at: str | float | None = None  # ISO 8601 (the writers); epoch seconds are read too
    ended_at: str | float | None = None


class CellSummary(msgspec.Struct):
    """``<phase>/<arm>/<rep>/<workload>/c<c>/summary.json`` (schema ``cell-summary``; cell.summarize,
    cell.failed_summary, upstream.import_cell)."""

    keys: CellKeys
    fingerprint: str | None
    corpus: Corpus
    validity: Validity
    requests: Requests
    tokens: Tokens
    wall_seconds: float | None
    speculative: Speculative
    times: CellTimes
    latency_ms: dict[str, Dist] = {}
    # open sections, flattened into the cells table as written
    telemetry: Json | None = None
    server_deltas: Json | None = None
    confounds: Json | None = None
    loadgen: Json | None = None
    tokens_per_event: Json | None = None
    schema: str = "specstudy.cell/1"

    def latency(self, metric: str, stat: str) -> float | None:
        d = self.latency_ms.get(metric)
        return None if d is None else getattr(d, stat)

    def sections(self) -> dict[str, Json]:
        """The sections the cells table flattens (``latency_ms``, ``telemetry``, ...), those present."""
        out = {"latency_ms": msgspec.to_builtins(self.latency_ms) if self.latency_ms else None,
               "telemetry": self.telemetry, "server_deltas": self.server_deltas, "confounds": self.confounds,
               "loadgen": self.loadgen, "tokens_per_event": self.tokens_per_event}
        return {k: v for k, v in out.items() if isinstance(v, dict)}


class Failure(msgspec.Struct):
    stage: str | None
    reason: str | None
    error_excerpt: str | None = None
    log: str | None = None


class DeploymentTimes(msgspec.Struct):
    start: str | float | None = None  # ISO 8601 (the writers); epoch seconds are read too
    ready: str | float | None = None
    stop: str | float | None = None


class CellRef(msgspec.Struct):
    workload: str
    concurrency: int
    summary: str | None
    status: str
    deployment_id: str | None = None


class TensorParallel(msgspec.Struct):
    target: int
    draft: int | None = None


class Extension(msgspec.Struct):
    """What an extension phase's deployment produced besides its cells (paths into its attempt)."""

    attempt: str | None = None
    sampled_capture: str | None = None
    memory: str | None = None
    profile: str | None = None
    profile_traces: str | None = None


class DeploymentRecord(msgspec.Struct):
    """``<phase>/<arm>/<rep>/deployment.json`` (schema ``deployment``; job.run) and
    ``deployment-failures/<phase>/<arm>/<rep>/<id>/failure.json`` (schema ``deployment-failure``;
    deployment.records.write_failure_record), which has no cache_config, cells or start-up."""

    deployment_id: str
    phase: str
    arm: Json  # the plan's arm spec, as written (name, method, its settings)
    rep: int
    status: str
    failure: Failure | None
    command: list[str] | None
    times: DeploymentTimes
    provenance: Json | None = None
    confounds: Json | None = None
    cache_config: Json | None = None
    cells: list[CellRef] = []
    startup: Json | None = None
    tensor_parallel_size: TensorParallel | None = None
    rep_label: str | None = None
    kind: str | None = None
    schema: str | None = None
    extension: Extension | None = None  # an extension phase's artifacts (specstudy.study.phase_decl)
    engine: Json | None = None  # a study of several engine builds: {name, label, overlay} of the arm's build

    @property
    def arm_name(self) -> str | None:
        return self.arm.get("name")

    @property
    def hostname(self) -> str | None:
        """The node the server ran on (provenance.hardware.hostname, deployment.provenance.hardware_info)."""
        hw = (self.provenance or {}).get("hardware")
        return hw.get("hostname") if isinstance(hw, dict) else None

    @property
    def target_tensor_parallel_size(self) -> int | None:
        """The target's TP size: ``tensor_parallel_size.target`` of a deployment.json; a failure.json has
        none, so its provenance's (deployment.provenance.collect_provenance), else the launch log's (confounds)."""
        if self.tensor_parallel_size is not None:
            return self.tensor_parallel_size.target
        prov_tp = (self.provenance or {}).get("tensor_parallel_size")
        if isinstance(prov_tp, dict) and prov_tp.get("target") is not None:
            return int(prov_tp["target"])
        log_tp = number((self.confounds or {}).get("tensor_parallel_size"))
        return None if log_tp is None else int(log_tp)


class GateControl(msgspec.Struct):
    kind: str  # cross_deployment | within_deployment
    arm: str | None
    deployment_ids: list[str]
    captures: list[str]
    pairs: list[Json]
    worst_case: Json | None
    n_pairs: int | None = None  # the control's size: pairs its worst case is taken over
    n_deployments: int | None = None
    pairing: str | None = None


class GateTreatment(msgspec.Struct):
    pairs: list[Json]
    worst_case: Json | None
    all_prompts_succeeded: bool
    n_pairs: int | None = None
    pairing: str | None = None


class Verdict(msgspec.Struct):
    """What every gate record of one arm starts with (the greedy gate, the sampling gate)."""

    arm: str | None
    phase: str | None
    verdict: str  # pass | fail | no_verdict
    reasons: list[Reason]
    blocks_recommendation: bool
    claim: str


class GateRecord(Verdict):
    """``gates/<phase>/<arm>.json`` (schema ``gate``; gate.judge)."""

    margins: Json
    treatment: GateTreatment | None
    control: GateControl | None
    schema: str = "specstudy.gate/1"


class SamplingSummary(msgspec.Struct):
    n: int
    mean: float | None
    median: float | None
    min: float | None
    max: float | None


class SamplingCheck(msgspec.Struct):
    name: str  # all_requests_succeeded | length_difference | token_tvd | text_similarity
    test: str | None  # mannwhitneyu | ks_2samp
    alternative: str | None
    statistic: float | None
    p_value: float | None
    alpha: float | None
    treatment: SamplingSummary | None
    control: SamplingSummary | None
    effect: float | None
    margin: float | None
    allowance: float | None
    significant: bool | None
    material: bool | None
    passed: bool


class SamplingGateRecord(Verdict):
    """``sampling`` gate record of one speculative arm (schema ``sampling-gate``; sampling.judge)."""

    settings: Json
    unit: str  # token_id | word
    n_prompts: int
    checks: list[SamplingCheck]
    treatment: Json
    control: Json | None
    lengths: Json
    schema: str = "specstudy.sampling-gate/1"


class SelectionInput(msgspec.Struct):
    path: str
    sha256: str


class SelectionCandidate(msgspec.Struct):
    arm: str
    why: Any


class SelectionRecord(msgspec.Struct):
    """``selection/selection.json`` (schema ``selection``; select.run_selection)."""

    confirmation_arms: list[str]
    candidates: list[SelectionCandidate]
    inputs: list[SelectionInput]
    phase_of_inputs: str
    prereg_sha256: str
    digest: str | None = None
    schema: str = "specstudy.selection/1"


# The capacity search's records and the plan are read back exactly as written: fields the schema leaves
# optional default to UNSET (omitted when encoded, so an absent key stays absent), numbers stay int or float as
# written (``Num``), and open sections stay mappings; a record decodes and re-encodes (atomic's sorted-key JSON)
# to the same bytes. kw_only lets the fields follow the writer's order.


class CapacityStep(msgspec.Struct, kw_only=True):
    """A row of ``capacity/<arm>/steps.jsonl`` or ``soaks.jsonl`` (schema ``capacity-step``; capacity.step_row)."""

    schema: str
    arm: str | None | UnsetType = UNSET
    index: int
    phase: str  # bracket | bisect | soak_knee | soak_above
    offered_rate: Num
    achieved_rate: Num | None
    send_rate: Num | None | UnsetType = UNSET
    n_requests: int | UnsetType = UNSET
    n_errors: int | UnsetType = UNSET
    error_rate: Num | None
    ttft_p50_ms: Num | None
    ttft_p95_ms: Num | None
    tpot_p50_ms: Num | None
    tpot_p95_ms: Num | None
    backlog_slope: Num | None
    backlog_slope_t: Num | None | UnsetType = UNSET
    waiting_max: Num | None | UnsetType = UNSET
    waiting_samples: int | UnsetType = UNSET
    preemptions: Num | None
    kv_cache_usage_max: Num | None | UnsetType = UNSET
    lateness_p99_ms: Num | None
    lateness_max_ms: Num | None | UnsetType = UNSET
    lateness_sends: int | UnsetType = UNSET
    late_sends: int | None | UnsetType = UNSET
    late_fraction: Num | None | UnsetType = UNSET
    late_p_value: Num | None | UnsetType = UNSET
    client_cpu_share: Num | None | UnsetType = UNSET
    pool_wait_p99_ms: Num | None | UnsetType = UNSET
    event_loop_lag_p99_ms: Num | None | UnsetType = UNSET
    event_loop_lag_samples: int | None | UnsetType = UNSET  # the load generator's tail test (loadgen.judge_limits)
    event_loop_lag_late: int | None | UnsetType = UNSET
    event_loop_lag_p_value: Num | None | UnsetType = UNSET
    event_loop_lag_max_ms: Num | None | UnsetType = UNSET
    pool_wait_samples: int | None | UnsetType = UNSET
    pool_wait_late: int | None | UnsetType = UNSET
    pool_wait_p_value: Num | None | UnsetType = UNSET
    pool_wait_max_ms: Num | None | UnsetType = UNSET
    loadgen_limited: bool | None | UnsetType = UNSET
    loadgen_limited_reasons: list[str] | None | UnsetType = UNSET
    duration_s: Num | None | UnsetType = UNSET
    gates: dict[str, str]  # gate -> pass | fail | no_data | skipped
    failed_gates: list[str] | UnsetType = UNSET
    verdict: str  # pass | fail | client_limited
    client_limited: bool
    notes: list[Any] | UnsetType = UNSET
    artifacts: str | None | UnsetType = UNSET
    soak_round: int | UnsetType = UNSET  # soaks only
    confirm_round: int | UnsetType = UNSET


class KneeBracket(msgspec.Struct, kw_only=True):
    last_pass_rps: Num | None
    first_fail_rps: Num | None
    client_limited_rps: Num | None


class ClientCapacity(msgspec.Struct, kw_only=True):
    rps: Num | None
    source: str  # config | measured
    measured_rps: Num | None | UnsetType = UNSET
    ceiling_rps: Num | None | UnsetType = UNSET


class KneeMove(msgspec.Struct, kw_only=True):
    from_knee_rps: Num
    to_knee_rps: Num
    direction: str  # down | up
    why: str | UnsetType = UNSET


class SoakedRate(msgspec.Struct, kw_only=True):
    rate_rps: Num
    verdicts: list[str]


class KneeConfirmation(msgspec.Struct, kw_only=True):
    count: int
    duration_s: Num
    knee_verdicts: list[str]
    above_verdicts: list[str]
    knee_all_pass: bool | None | UnsetType = UNSET
    above_any_fail: bool | None | UnsetType = UNSET
    above_fail_majority: bool | None | UnsetType = UNSET
    confirmed: bool
    moves: list[KneeMove] | UnsetType = UNSET
    soaked: list[SoakedRate] | UnsetType = UNSET


class CapacityKnee(msgspec.Struct, kw_only=True):
    """``capacity/<arm>/knee.json`` (schema ``capacity-knee``; capacity.search, capacity.run_capacity)."""

    schema: str
    arm: str | None
    status: str  # confirmed | unconfirmed | refused | no_knee_below_max | no_passing_rate
    knee_rps: Num | None
    step_above_rps: Num | None
    bracket: KneeBracket
    resolution_frac: Num
    n_steps: int | UnsetType = UNSET
    n_soaks: int | UnsetType = UNSET
    client_capacity: ClientCapacity
    confirmation: KneeConfirmation
    reasons: list[Reason]
    deployment: Json | None  # capacity.deployment_summary of the arm's deployment record, as written
    gates_file: str | UnsetType = UNSET


class PlannedCell(msgspec.Struct, kw_only=True):
    workload: str
    concurrency: int


class PlannedDeployment(msgspec.Struct, kw_only=True):
    phase: str
    arm: str
    rep: str  # rep<n> | drift<n>
    kind: str  # repeat | drift
    round: int | None | UnsetType = UNSET  # None for a drift baseline
    block: int
    adaptive: bool | UnsetType = UNSET
    cells: list[PlannedCell]
    position_in_block: int | UnsetType = UNSET
    after: str | None  # "<arm>/<rep>" planned right before in the block
    order: int


class PlanSkip(msgspec.Struct, kw_only=True):
    arm: str
    reason: str


class PlannedCorpus(msgspec.Struct, kw_only=True):
    name: str | None | UnsetType = UNSET
    version: str | int | None | UnsetType = UNSET
    digest: str | None


class Plan(msgspec.Struct, kw_only=True):
    """``plan/<phase>.json`` (schema ``plan``; plan.make_plan, plan_cli._cmd_plan)."""

    schema: str
    phase: str
    seed: int
    design: Json  # concurrency, repeats, workloads, blocks and the design's description, as written
    arms: list[Json]  # the arm specs (name, method, its settings), as written
    skipped: list[PlanSkip]
    deployments: list[PlannedDeployment]
    corpora: dict[str, PlannedCorpus] | UnsetType = UNSET  # corpus dir -> the corpus planned with
    selection: SelectionInput | UnsetType = UNSET  # confirmation: the selection the plan was built from

    def deployment(self, arm: str, rep: str) -> PlannedDeployment:
        for dep in self.deployments:
            if dep.arm == arm and dep.rep == rep:
                return dep
        raise KeyError(f"{self.phase} plan has no deployment {arm}/{rep}")


def _decode(path: str | os.PathLike, type_: type, what: str):
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise RecordError(f"{path}: cannot read the {what} ({exc})") from exc
    try:
        return msgspec.json.decode(raw, type=type_, strict=False)
    except msgspec.ValidationError as exc:
        raise RecordError(f"{path}: {exc} (not a {what} as config/schemas describes it; re-run the job that "
                          "wrote it)") from exc
    except msgspec.DecodeError as exc:
        raise RecordError(f"{path}: not valid JSON ({exc}); fix or delete the file and re-run its job") from exc


def read_cell_summary(path: str | os.PathLike) -> CellSummary:
    return _decode(path, CellSummary, "cell summary")


def read_deployment(path: str | os.PathLike) -> DeploymentRecord:
    """A ``deployment.json`` or a ``failure.json`` of ``deployment-failures/``."""
    return _decode(path, DeploymentRecord, "deployment record")


def read_gate(path: str | os.PathLike) -> GateRecord:
    return _decode(path, GateRecord, "gate record")


def read_sampling_gate(path: str | os.PathLike) -> SamplingGateRecord:
    return _decode(path, SamplingGateRecord, "sampling gate record")


def read_selection(path: str | os.PathLike) -> SelectionRecord | None:
    """The selection, or ``None`` when none has run (no file)."""
    return _decode(path, SelectionRecord, "selection") if Path(path).exists() else None


def read_capacity_steps(path: str | os.PathLike) -> list[CapacityStep]:
    """The rows of a ``steps.jsonl`` or ``soaks.jsonl``; an error names the file, the line and the field."""
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise RecordError(f"{path}: cannot read the capacity steps ({exc})") from exc
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(msgspec.json.decode(line, type=CapacityStep, strict=False))
        except msgspec.ValidationError as exc:
            raise RecordError(f"{path}:{n}: {exc} (not a capacity step as config/schemas describes it; re-run the "
                              "capacity search)") from exc
        except msgspec.DecodeError as exc:
            raise RecordError(f"{path}:{n}: not valid JSON ({exc}); fix or delete the file and re-run its job") from exc
    return rows


def read_knee(path: str | os.PathLike) -> CapacityKnee:
    return _decode(path, CapacityKnee, "capacity knee")


def read_plan(path: str | os.PathLike) -> Plan:
    return _decode(path, Plan, "plan")


def to_record(data: Json, type_: type, source: str = "<record>"):
    """A typed record from an already-parsed dict (tests, records embedded in others)."""
    try:
        return msgspec.convert(data, type_, strict=False)
    except msgspec.ValidationError as exc:
        raise RecordError(f"{source}: {exc}") from exc
