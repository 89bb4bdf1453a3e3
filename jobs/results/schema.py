"""The results row: one row per case execution, and its Arrow schema.

``COLUMNS`` below is the one place that names each column, its Arrow type,
its unit and what it means; ``SCHEMA`` is built from it (each field carries
its unit and description as field metadata, so a Parquet file documents
itself) and every file stores ``SCHEMA_VERSION`` under the schema metadata
key ``SCHEMA_VERSION_KEY``.

Bump ``SCHEMA_VERSION`` when a column is added, removed or retyped. Readers
take files of any version up to the current one: columns a file lacks read
as null.

Units: ``us`` microseconds, ``MHz``, ``degC``, ``BF16 ULP`` units in the last
place of the output dtype, ``count`` a plain number, ``-`` a label or text.
All timestamps are UTC with microsecond resolution.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cluster.placement import Placement

SCHEMA_VERSION = 5
"""2: the ``job`` column. 3: files leave out ``suite`` (the partition key
gives it) and the per-run facts (``runs.RUN_FACTS``, kept once in the run
manifest); readers fill both in, so ``read_results`` returns the same
columns as for version 2. 4: the straggler columns (``publish_skew_us``,
``publish_skew_max_us``, ``last_rank``, ``last_rank_share``,
``publish_offsets_us``); null in the rows of older files. 5: the bandwidth
columns ``algbw_gbps`` and ``busbw_gbps`` (profile rows; before, in
``extra`` as ``algbw_GBps`` / ``busbw_GBps``); null in the rows of older
files."""
SCHEMA_VERSION_KEY = b"lamport_lab.schema_version"

OUTCOMES = ("pass", "fail", "hang", "error", "skipped")
NIGHTLY = "nightly"
"""The trigger of the scheduled runs: the dashboard's latest run and the
regression history are nightly runs."""
TRIGGERS = (NIGHTLY, "adhoc", "ci")
#: gpu: kernels ran on GPUs; emulated: the protocol in numpy on CPU actors;
#: cpu-reference: torch references only; compile: kernels compiled for an
#: arch and their PTX checked, nothing launched.
BACKENDS = ("gpu", "emulated", "cpu-reference", "compile")
#: The job that wrote a row (``python -m jobs <job>``; the nightly runs the
#: first five; ``bisect`` writes a verdict per commit it tried, jobs/bisect.py).
JOBS = ("selfcheck", "compile-check", "correctness", "faults", "profile", "bisect")


@dataclass(frozen=True)
class Column:
    """One results column: name, Arrow type, unit and meaning.

    ``required`` columns must be non-null in every written row.
    """

    name: str
    type: pa.DataType
    unit: str
    doc: str
    required: bool = False


_TS = pa.timestamp("us", tz="UTC")

COLUMNS: tuple[Column, ...] = (
    # Run identity.
    Column("run_id", pa.string(), "-", "id shared by every row of one run", True),
    Column("started_at", _TS, "UTC", "when the case started", True),
    Column("finished_at", _TS, "UTC", "when the case finished"),
    Column("trigger", pa.string(), "-", "one of TRIGGERS", True),
    Column("git_commit", pa.string(), "-", "commit SHA of the code that ran"),
    # Case identity.
    Column("suite", pa.string(), "-", "suite name; also the partition key", True),
    Column("job", pa.string(), "-", "one of JOBS: the job that wrote the row (null in files "
           "of schema version 1)"),
    Column("op", pa.string(), "-", "operation, e.g. allreduce_norm", True),
    Column("variant", pa.string(), "-", "kernel variant / tuning name"),
    Column("transport", pa.string(), "-", "multicast or unicast"),
    Column("placement", pa.string(), "-", ", ".join(Placement)),
    Column("backend", pa.string(), "-", "one of BACKENDS"),
    Column("tp", pa.int32(), "count", "ranks in the TP group"),
    Column("hidden", pa.int32(), "count", "elements per token"),
    Column("tokens", pa.int32(), "count", "tokens per call"),
    Column("top_k", pa.int32(), "count", "experts per token (finalize ops)"),
    Column("hc", pa.int32(), "count", "mHC streams"),
    Column("dtype", pa.string(), "-", "element type, e.g. bfloat16"),
    # Outcome.
    Column("outcome", pa.string(), "-", "one of OUTCOMES", True),
    Column("reason", pa.string(), "-", "why the case did not pass (or was skipped)"),
    # Numerics (worst over outputs and ranks).
    Column("max_ulp", pa.float64(), "BF16 ULP", "largest error against the reference"),
    Column("max_abs_err", pa.float64(), "output units", "largest absolute error"),
    Column("mismatches", pa.int64(), "count", "elements outside their bound"),
    Column("elements", pa.int64(), "count", "elements checked"),
    # Timing over t_n timed iterations.
    Column("t_n", pa.int64(), "count", "timed iterations"),
    Column("t_min_us", pa.float64(), "us", "fastest iteration"),
    Column("t_median_us", pa.float64(), "us", "median iteration"),
    Column("t_mean_us", pa.float64(), "us", "mean iteration"),
    Column("t_p90_us", pa.float64(), "us", "90th percentile iteration"),
    Column("t_p99_us", pa.float64(), "us", "99th percentile iteration"),
    Column("t_stdev_us", pa.float64(), "us", "sample standard deviation"),
    Column("t_max_over_ranks_median_us", pa.float64(), "us",
           "median over iterations of the slowest rank's time"),
    # Bandwidth at t_median_us, as nccl-tests defines it: algbw = bytes / time, bytes
    # the op's workload declares per call and rank (cluster/measure/workloads);
    # busbw = algbw x the op's bus factor (docs/results-schema.md lists them).
    Column("algbw_gbps", pa.float64(), "GB/s", "bytes per call / t_median_us (nccl-tests' "
           "algbw; 1 GB = 1e9 bytes)"),
    Column("busbw_gbps", pa.float64(), "GB/s", "algbw_gbps x the op's bus factor (nccl-tests' "
           "busbw: 2 (tp - 1) / tp for the all-reduce ops, 1 for a local op)"),
    # Stragglers over the case's calls (cluster.stragglers): each rank's publish start
    # after the group's first rank's, from the mark its publish timing starts at.
    Column("publish_skew_us", pa.float64(), "us", "median over calls of the last rank's "
           "publish start after the first's"),
    Column("publish_skew_max_us", pa.float64(), "us", "the largest such skew of a call"),
    Column("last_rank", pa.int32(), "rank id", "the rank that started publishing last most "
           "often (the lowest of a tie)"),
    Column("last_rank_share", pa.float64(), "fraction", "of the calls, how often last_rank "
           "was last"),
    Column("publish_offsets_us", pa.list_(pa.float64()), "us", "per rank (index = rank), the "
           "median over calls of its publish start after the group's first"),
    Column("baseline", pa.string(), "-", "name of what the timing is compared with"),
    Column("baseline_median_us", pa.float64(), "us", "the baseline's median iteration"),
    Column("ratio", pa.float64(), "-", "t_median_us / baseline_median_us (< 1 is faster)"),
    # GPU state around the measurement.
    Column("sm_clock_mhz_before", pa.int32(), "MHz", "SM clock before timing"),
    Column("sm_clock_mhz_after", pa.int32(), "MHz", "SM clock after timing"),
    Column("mem_clock_mhz", pa.int32(), "MHz", "memory clock"),
    Column("temp_c_before", pa.int32(), "degC", "GPU temperature before timing"),
    Column("temp_c_after", pa.int32(), "degC", "GPU temperature after timing"),
    # Fault campaign.
    Column("fault_kind", pa.string(), "-", "injected fault, null if none"),
    Column("fault_expected", pa.string(), "-", "expected outcome of the fault"),
    Column("fault_seen", pa.string(), "-", "observed outcome"),
    Column("missing_ranks", pa.list_(pa.int32()), "rank ids", "ranks the group view blames"),
    Column("fault_token", pa.int32(), "index", "token where the watchdog fired"),
    Column("fault_fragment", pa.int32(), "index", "fragment where the watchdog fired"),
    Column("fault_stage", pa.int32(), "index", "Lamport generation (0..2)"),
    Column("diagnosis", pa.string(), "-", "human-readable fault diagnosis"),
    Column("repro_command", pa.string(), "-", "one command that reruns exactly this case "
           "(every row that did not pass has one)"),
    # Environment.
    Column("nodes", pa.int32(), "count", "nodes in the run"),
    Column("gpu_model", pa.string(), "-", "GPU name"),
    Column("gpu_count", pa.int32(), "count", "GPUs visible per node"),
    Column("driver", pa.string(), "-", "NVIDIA driver version"),
    Column("cuda", pa.string(), "-", "CUDA version torch was built with"),
    Column("torch", pa.string(), "-", "torch version"),
    Column("cute_dsl", pa.string(), "-", "nvidia-cutlass-dsl version"),
    Column("ray", pa.string(), "-", "ray version"),
    Column("pyarrow", pa.string(), "-", "pyarrow version"),
    Column("python", pa.string(), "-", "Python version"),
    Column("hostname", pa.string(), "-", "host that wrote the row"),
    Column("topology", pa.string(), "JSON", "the cluster as discovered: nodes, GPUs, links, "
           "layouts (cluster.topology.Topology.summary(); brief() reads it as one line)"),
    Column("multicast_supported", pa.bool_(), "-", "NVLS multicast usable by the group"),
    Column("extra", pa.string(), "JSON", "JSON object for anything else"),
)

SCHEMA = pa.schema(
    [
        pa.field(c.name, c.type, nullable=not c.required,
                 metadata={"unit": c.unit, "doc": c.doc})
        for c in COLUMNS
    ],
    metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)

_NAMES = frozenset(c.name for c in COLUMNS)
_CHOICES = {"outcome": OUTCOMES, "trigger": TRIGGERS, "backend": BACKENDS, "job": JOBS}


def make_row(**fields: Any) -> dict[str, Any]:
    """Return a complete row: every column, missing ones as None.

    Raises ValueError naming the offending field when a name is not a column,
    ``outcome`` is not in OUTCOMES, ``trigger``/``backend`` is set to a value
    outside TRIGGERS/BACKENDS/JOBS, a timestamp is naive, or ``extra`` is not a
    JSON object. ``extra`` may be given as a mapping (it is serialised) and
    ``missing_ranks`` as any iterable of ints (it is sorted). Applying
    make_row to its own result returns an equal row. Value types are checked
    when rows are converted (``rows_to_table``).
    """
    unknown = sorted(set(fields) - _NAMES)
    if unknown:
        raise ValueError(f"unknown results field(s) {unknown}; see jobs.results.schema.COLUMNS")
    row = dict.fromkeys(c.name for c in COLUMNS)
    row.update(fields)
    for name, choices in _CHOICES.items():
        value = row[name]
        if (value is not None or name == "outcome") and value not in choices:
            raise ValueError(f"{name}={value!r} is not one of {choices}")
    for name in ("started_at", "finished_at"):
        value = row[name]
        if isinstance(value, dt.datetime) and value.utcoffset() is None:
            raise ValueError(f"{name}={value!r} is naive; give an aware datetime (UTC)")
    row["extra"] = _json_object(row["extra"])
    if row["missing_ranks"] is not None:
        row["missing_ranks"] = sorted(row["missing_ranks"])
    return row


def row_job(row: Mapping[str, Any]) -> str | None:
    """The job that wrote ``row``: its ``job`` column, or for files of
    schema version 1 ``extra.job`` (compile and self-check rows had none:
    their backend says it)."""
    if row.get("job"):
        return row["job"]
    extra = row.get("extra") or {}
    try:
        job = (extra if isinstance(extra, Mapping) else json.loads(extra)).get("job")
    except (json.JSONDecodeError, TypeError, AttributeError):
        job = None
    return job or {"compile": "compile-check", "cpu-reference": "selfcheck"}.get(row.get("backend"))


def _json_object(extra: Mapping[str, Any] | str | None) -> str | None:
    """``extra`` as a JSON object string; ValueError if it is not one."""
    if extra is None:
        return None
    if isinstance(extra, Mapping):
        return json.dumps(extra, sort_keys=True)
    try:
        parsed = json.loads(extra)
    except (TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"extra={extra!r} is not a JSON object string: {err}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"extra={extra!r} is JSON but not an object")
    return extra


def rows_to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Convert complete rows (from ``make_row``) to a Table with ``SCHEMA``.

    Raises ValueError naming the row index and column when a required column
    is None or a value does not convert to the column's type.
    """
    rows = list(rows)
    arrays = []
    for column in COLUMNS:
        values = [row[column.name] for row in rows]
        if column.required and None in values:
            raise ValueError(
                f"row {values.index(None)}: required column {column.name!r} is None")
        try:
            arrays.append(pa.array(values, type=column.type))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
            raise ValueError(
                f"column {column.name!r} ({column.type}): {_bad_value(values, column.type)}: {err}"
            ) from None
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _bad_value(values: list[Any], type_: pa.DataType) -> str:
    """Name the first value that does not convert to ``type_``."""
    for index, value in enumerate(values):
        try:
            pa.array([value], type=type_)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return f"row {index} value {value!r}"
    return "values"


def markdown_table() -> str:
    """``COLUMNS`` as the Markdown table of docs/results-schema.md
    (``python -m jobs schema`` prints it; a test keeps the doc equal)."""
    lines = ["| column | type | unit | meaning |", "| --- | --- | --- | --- |"]
    for c in COLUMNS:
        doc = c.doc.replace("|", "\\|") + (" (always set)" if c.required else "")
        lines.append(f"| `{c.name}` | {c.type} | {c.unit} | {doc} |")
    return "\n".join(lines)
