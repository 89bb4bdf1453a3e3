"""Suite configs, filters and bad command lines: clear messages, exit 2,
nothing written (no Ray is started for any of these)."""

import dataclasses
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import __main__ as cli
from jobs.config import (ConfigError, Filters, bundled_suites, load_suite, select,
                         suite_path)
from jobs.recorder import repro_command

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """The module's promise, checked: a test here that reached the Ray
    session would fail, not start a cluster outside the "ray" xdist group."""
    import jobs.session as session
    monkeypatch.setattr(session, "ray_session",
                        lambda *a, **k: pytest.fail("a test of test_jobs_config.py started Ray"))

GOOD = """
format = 1
name = "mine"
version = 3
[[correctness]]
op = "all_reduce_norm"
tp = [2, 4]
hidden = 256
tokens = [1, 3]
inputs = ["random"]
"""


def test_bundled_suites_load_and_expand():
    assert {"smoke", "nightly", "full"} <= set(bundled_suites())
    for name in bundled_suites():
        suite = load_suite(suite_path(name))
        assert suite.name == name and suite.version >= 1 and suite.cases
        assert suite.selfcheck is not None and suite.compile_check is not None
    smoke = load_suite(suite_path("smoke"))
    from cluster.faults import FAULT_KINDS
    assert {c.fault for c in smoke.of("faults")} == set(FAULT_KINDS)
    # A group's cases keep the suite's M sequence.
    tp2 = [c.tokens for c in smoke.of("correctness") if c.op == "all_reduce_norm"
           and c.tp == 2 and c.inputs == "random" and c.placement == "auto"]
    assert tp2 == [1, 3, 8, 2]


def test_every_op_selector_reads_the_registry(tmp_path):
    """``op = "*"``: every registered op the job applies to (correctness:
    all; faults: those with fault kinds; profile: those with a workload),
    read when the suite loads; ``ops = "*"`` in [compile_check] is every op
    with compile variants (the empty default)."""
    from cluster import ops
    from jobs.config import job_ops
    path = tmp_path / "every.toml"
    path.write_text("format = 1\nname = 'every'\nversion = 1\n[compile_check]\nops = '*'\n"
                    "[[correctness]]\nop = '*'\ntp = 1\nhidden = 2048\ntokens = 1\n"
                    "[[faults]]\nop = '*'\ntp = 2\nhidden = 1024\ntokens = 4\n"
                    "kinds = ['skip_publish']\n")
    suite = load_suite(path)
    assert suite.compile_check["ops"] == []
    assert {c.op for c in suite.of("correctness")} == set(ops.names())
    faulted = {n for n in ops.names() if ops.get(n).faults}
    assert {c.op for c in suite.of("faults")} == faulted == set(job_ops("faults"))
    assert job_ops("profile") == ops.profiled()
    with pytest.raises(ValueError, match=r"job = 'bogus' is not one of \['correctness'"):
        job_ops("bogus")
    nightly = load_suite(suite_path("nightly"))
    assert {c.op for c in nightly.of("faults")} == faulted


def test_every_repro_command_selects_exactly_its_case():
    parser = cli.build_parser()  # one parser, as a process has (each parse is fresh)
    for name in ("smoke", "nightly"):
        suite = load_suite(suite_path(name))
        for case in suite.cases:
            argv = shlex.split(repro_command(case, suite, "emulated"))[3:]
            args = parser.parse_args(argv)
            assert args.jobs == (case.job,)
            chosen = select(suite, args.jobs,
                            Filters(**{n: getattr(args, n) for n in Filters.FIELDS}))
            assert chosen == [case], (case, chosen)


def test_filters_narrow_and_an_empty_selection_is_an_error():
    suite = load_suite(suite_path("smoke"))
    chosen = select(suite, ("correctness",), Filters(ops=("all_reduce_norm",), tp=(2,),
                                                     tokens=(3,)))
    assert {(c.tp, c.tokens) for c in chosen} == {(2, 3)} and len(chosen) == 6
    mhc = select(suite, ("correctness",), Filters(ops=("all_reduce_mhc",),
                                                  op_args=("finalize=true",)))
    assert len(mhc) == 2 and all(dict(c.op_args)["finalize"] is True for c in mhc)
    with pytest.raises(ConfigError, match="--op-args: 'finalize' must be NAME=VALUE"):
        select(suite, ("correctness",), Filters(op_args=("finalize",)))
    virtual = select(suite, ("correctness",), Filters(tp=(2,), tokens=(3,),
                                                      placement=("virtual-ranks",)))
    assert {c.placement for c in virtual} == {"virtual-ranks"} and len(virtual) == 3
    actors = select(suite, ("correctness",), Filters(tp=(2,), placement=("shared-gpu",)))
    assert {c.placement for c in actors} == {"auto"}  # auto may become shared-gpu
    with pytest.raises(ConfigError, match=r"select no correctness case.*'tp': \[1, 2, 4, 8\]"):
        select(suite, ("correctness",), Filters(tp=(16,)))
    with pytest.raises(ConfigError, match="--ops: unknown value"):
        select(suite, ("correctness",), Filters(ops=("allreduce",)))
    with pytest.raises(ConfigError, match="--faults: unknown fault kind"):
        select(suite, ("faults",), Filters(faults=("skip",)))


@pytest.mark.parametrize("text, message", [
    ("format = 2\nname='x'\nversion=1", "format = 2"),
    ("format = 1\nname='x'\nversion=1\nbogus=1", r"unknown key\(s\) \['bogus'\]"),
    (GOOD.replace("tokens = [1, 3]", "tokens = [1, 3]\ntpp = 2"), r"\[\[correctness\]\] #1: unknown key\(s\) \['tpp'\]"),
    (GOOD.replace('op = "all_reduce_norm"', 'op = "allreduce"'), "op = 'allreduce' is not one of"),
    (GOOD.replace("hidden = 256", "hidden = -64"), "hidden = -64: hidden must be a positive multiple of 8"),
    (GOOD.replace("hidden = 256\n", ""), "hidden is required"),
    (GOOD.replace('inputs = ["random"]', 'inputs = ["randn"]'), "inputs = 'randn' is not one of"),
    (GOOD + "[[faults]]\nop='all_reduce_norm'\ntp=2\nhidden=256\ntokens=4\nkinds=['nap']",
     r"unknown fault kind\(s\) \['nap'\]"),
    (GOOD + "[[faults]]\nop='all_reduce_norm'\ntp=2\nhidden=256\ntokens=4\nrank=5",
     r"rank = 5 is outside 0..1"),
    ("format = 1\nname = 'x'\nversion = 1\n[[correctness]\n", "not valid TOML"),
    (GOOD + "[[profile]]\nop='all_reduce_norm'\ntp=1\nhidden=256\ntokens=4\nmin_replay_ms=-1",
     r"min_replay_ms = -1: must be in \[0, 60_000\] ms"),
    (GOOD + "[[profile]]\nop='all_reduce_norm'\ntp=1\nhidden=256\ntokens=4\nmin_replays=-1",
     r"min_replays = -1: must be in \[0, 1_000_000\]"),
    (GOOD + "[[profile]]\nop='all_reduce_norm'\ntp=1\nhidden=256\ntokens=4\ncalls=100000",
     r"calls = 100000: must be in \[1, 10_000\]"),
    (GOOD.replace('inputs = ["random"]', 'repeats = 1000000000'),
     r"repeats = 1000000000: must be in \[1, 10_000\]"),
    (GOOD.replace('inputs = ["random"]', 'timeout_s = 1e300'),
     r"timeout_s = 1e\+300: must be in \(0, 86_400\] s"),
    (GOOD.replace('inputs = ["random"]', 'budget_ns = 999'),
     r"budget_ns = 999: must be in \[1_000, 600_000_000_000\] ns"),
    (GOOD.replace('inputs = ["random"]', 'budget_ns = 1e9'),
     r"budget_ns = 1000000000.0: must be an integer in \[1_000, 600_000_000_000\] ns"),
    (GOOD.replace('inputs = ["random"]', 'budget_ns = 1e300'), r"budget_ns = 1e\+300: must be an"),
    # the budget's former names: refused, naming budget_ns and the value to write
    (GOOD.replace('inputs = ["random"]', 'budget_ms = 1000'),
     r"budget_ms = 1000 is no longer read; the budget is budget_ns, in integer nanoseconds: "
     r"write budget_ns = 1_000_000_000"),
    (GOOD.replace('inputs = ["random"]', 'budget_ms = 0.5'), r"write budget_ns = 500_000\b"),
    (GOOD + "[[profile]]\nop='all_reduce_norm'\ntp=1\nhidden=256\ntokens=4\nwatchdog_ns=7",
     r"\[\[profile\]\] #1: watchdog_ns = 7 is no longer read; .*write budget_ns = 7"),
    (GOOD.replace("version = 3", "version = 3\nmemory_limit_gb = 1e308"),
     r"memory_limit_gb = 1e\+308: must be in \(0, 1_048_576\] GiB"),
    (GOOD + "[[correctness]]\nop='all_reduce_mhc'\ntp=2\nhidden=256\ntokens=4\nhc=9",
     r"op all_reduce_mhc: hc = 9 is not valid; expected an int in 1..8"),
    (GOOD + "[[correctness]]\nop='finalize_publish'\ntp=2\nhidden=256\ntokens=4\ntop_k=129",
     r"top_k = 129: must be in \[1, 128\]"),
    (GOOD.replace("version = 3", "version = 3\n[compile_check]\nhidden = [12]"),
     r"\[compile_check\]: hidden must be a positive multiple of 8, got 12"),
    (GOOD.replace("version = 3", "version = 3\n[compile_check]\ntp = [3]"),
     r"\[compile_check\]: tp must be one of 1, 2, 4, 8, got 3"),
    (GOOD.replace("version = 3", "version = 3\n[compile_check]\nops = ['bogus']"),
     r"\[compile_check\]: ops: unknown op 'bogus'"),
    ("format = 1\nname = 'x'\nversion = 1\nbogus = " + "[" * 5000 + "]" * 5000,
     "nested too deeply"),
    (GOOD + "[[profile]]\nop='all_reduce_norm'\ntp=1\nhidden=256\ntokens=4\nmin_replays=2.5",
     r"min_replays = 2.5: must be an integer in \[0, 1_000_000\]"),
])
def test_bad_configs_are_named(tmp_path, text, message):
    path = tmp_path / "suite.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_suite(path)


@pytest.mark.parametrize("sweep, message", [
    ("tp = [2, 4, 2]", "tp = [2, 4, 2] lists 2 twice"),
    ("tokens = [1, 3, 3]", "tokens = [1, 3, 3] lists 3 twice"),
    ("inputs = ['random', 'random']", "inputs = ['random', 'random'] lists 'random' twice"),
    ("op = ['all_reduce_norm', 'all_reduce_norm']", "lists 'all_reduce_norm' twice"),
    ("transport = ['unicast', 'unicast']", "lists 'unicast' twice"),
    ("mode = ['owner', 'owner']", "mode = ['owner', 'owner'] lists 'owner' twice"),
    ("residual = ['zeros', 'random', 'zeros']", "lists 'zeros' twice"),
])
def test_a_value_listed_twice_is_refused_naming_it(tmp_path, sweep, message):
    """Issue 64 item 8: at 4a8ac23 each case of a repeated value ran twice."""
    key = sweep.split(" = ")[0]
    lines = [line for line in GOOD.splitlines() if not line.startswith(f"{key} =")]
    path = tmp_path / "suite.toml"
    path.write_text("\n".join(lines) + f"\n{sweep}\n")
    with pytest.raises(ConfigError, match=r"\[\[correctness\]\] #1: " + key):
        load_suite(path)
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    assert message in str(err.value), err.value


@pytest.mark.parametrize("section, message", [
    ("[compile_check]\narch = []", "[compile_check] arch = [] selects nothing"),
    ("[compile_check]\narch = ['sm_90a', 'sm_90a']", "arch = ['sm_90a', 'sm_90a'] lists"),
    ("[compile_check]\nhidden = [2048, 2048]", "hidden = [2048, 2048] lists 2048 twice"),
    ("[compile_check]\nops = ['all_reduce_norm', 'all_reduce_norm']", "lists 'all_reduce_norm'"),
    ("[selfcheck]\ncases = ['a', 'a']", "[selfcheck] cases = ['a', 'a'] lists 'a' twice"),
    ("[[faults]]\nop='all_reduce_norm'\ntp=2\nhidden=256\ntokens=4\n"
     "kinds=['stuck_rank', 'stuck_rank']", "kinds = ['stuck_rank', 'stuck_rank'] lists"),
])
def test_sections_refuse_empty_and_repeated_lists(tmp_path, section, message):
    path = tmp_path / "suite.toml"
    path.write_text(GOOD + section + "\n")
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    assert message in str(err.value), err.value


@pytest.mark.parametrize("ops, op_args, message", [
    (None, "form=two", None),  # taken by the smoke suite's norm ops
    (("all_reduce_mhc",), "finalize=TRUE", None),  # compared case-insensitively, as keep does
    (("all_reduce_norm",), "finalize=true", "no selected op takes finalize; all_reduce_norm "
                                            "takes form, mode, residual"),
    (("all_reduce_mhc",), "finalize=maybe", "'maybe' is not a value of finalize; it takes "
                                            "false, true"),
    (("all_reduce_mhc",), "top_k=3", "it has a filter of its own: --top-k"),
    (("all_reduce_norm",), "mode=one-shot", "it takes one_shot, owner"),
    (("all_reduce_norm", "all_reduce_mhc"), "heads=32", "all_reduce_mhc takes finalize; "
                                                        "all_reduce_norm takes form"),
])
def test_op_args_the_selected_ops_do_not_take_are_refused(ops, op_args, message):
    """Issue 64 item 8: at 4a8ac23 such a filter was ignored (exit 0)."""
    suite = load_suite(suite_path("smoke"))
    filters = Filters(ops=ops, op_args=(op_args,))
    if message is None:
        assert select(suite, ("correctness",), filters)
        return
    with pytest.raises(ConfigError) as err:
        select(suite, ("correctness",), filters)
    assert str(err.value).startswith(f"--op-args {op_args!r}: ") and \
        message in str(err.value), err.value


def _main(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["nightly", "--suite", "nosuch"], "unknown suite 'nosuch'"),
    (["correctness", "--tp", "two"], "expected comma-separated integers"),
    (["correctness", "--tp", "16"], "select no correctness case"),
    (["correctness", "--ops", "allreduce"], "--ops: unknown value"),
    (["faults", "--faults", "nap"], "--faults: unknown value(s) ['nap']"),
    (["correctness", "--tp", "2,,4"], "--tp: expected a comma-separated list without empty items"),
    (["correctness", "--hidden", "1024,"], "without empty items"),
    (["correctness", "--placement", "moon"], "allowed: auto, process-per-gpu"),
    (["correctness", "--timeout", "0.5"], "host deadline 0.5 s must exceed"),
    (["faults", "--timeout", "0.5"], "must exceed 3 x the watchdog budget"),
    (["correctness", "--timeout", "-1"], "'-1': must be in (0, 86_400] s"),
    (["correctness", "--timeout", "1e308"], "'1e308': must be in (0, 86_400] s"),
    (["correctness", "--memory-limit-gb", "1e308"], "must be in (0, 1_048_576] GiB"),
    (["correctness", "--results", ""], "--results: expected a path, got ''"),
    (["correctness", "--address", "nowhere"], "give the GCS address HOST:PORT"),
    (["nightly", "--sigmas", "inf"], "'inf': must be in (0, 1_000]"),
    (["selfcheck", "--suite", "../x"], "--suite: must be an ASCII word"),
    (["selfcheck", "--run-id", "../x"], "--run-id: must be an ASCII word"),
    (["compact", "--out", ""], "--out: expected a path"),
    (["correctness", "--backend", "tpu"], "invalid choice: 'tpu'"),
    (["nightly", "--suite", "smoke", "--config", "x.toml"], "not allowed with argument"),
    (["nightly", "--suite", "smoke", "--history", "3", "--min-history", "5"],
     "need 1 <= min-history <= history"),
    (["nightly", "--jobs", "correctness,bench"], "--jobs: unknown value(s) ['bench']"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["report", "a", "b", "c"], "at most two run ids"),
])
def test_bad_command_lines_exit_2_and_write_nothing(tmp_path, capsys, argv, message):
    results = tmp_path / "results"
    extra = [] if argv[0] in ("nosuch",) else ["--results", str(results)]
    code, out, err = _main(capsys, *argv, *extra)
    assert code == 2, (out, err)
    assert message in err
    assert not results.exists()


def test_bad_config_file_exit_2_nothing_written(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace("tokens = [1, 3]", "tokens = [1, 3]\ntpp = 2"))
    results = tmp_path / "results"
    code, _, err = _main(capsys, "correctness", "--config", str(path), "--results", str(results))
    assert code == 2 and f"config {path}: [[correctness]] #1: unknown key(s) ['tpp']" in err
    assert not results.exists()


def test_gpu_backend_refused_by_name_when_not_registered(tmp_path, capsys, monkeypatch):
    from cluster import backend
    monkeypatch.delitem(backend.BACKENDS, "gpu", raising=False)
    code, _, err = _main(capsys, "correctness", "--backend", "gpu", "--results", str(tmp_path / "r"))
    assert code == 2 and "no 'gpu' backend is registered" in err
    assert not (tmp_path / "r").exists()


def test_results_path_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("")
    code, _, err = _main(capsys, "correctness", "--results", str(target))
    assert code == 2 and "is not a directory" in err


def test_the_command_line_itself_exits_2_with_a_message(tmp_path):
    done = subprocess.run([sys.executable, "-m", "jobs", "nightly", "--suite", "smoke", "--tp", "3",
                           "--results", str(tmp_path / "r")], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "python -m jobs nightly: error: filters {'tp': (3,)} select no" in done.stderr
    assert not (tmp_path / "r").exists()


def _view(gpus: int, backend: str = "gpu", groups_per_gpu: int = 1):
    """A ClusterView over a fake one-node topology of ``gpus`` NVLinked GPUs."""
    from cluster.topology import GpuInfo, NodeInfo, Topology
    from jobs.cluster_view import ClusterView
    node = NodeInfo(node_id="n0", hostname="h", gpus=tuple(
        GpuInfo(index=i, name="NVIDIA H200", uuid=f"GPU-{i}", memory_bytes=141 << 30,
                sm_count=132, compute_capability=(9, 0)) for i in range(gpus)),
        p2p=tuple(tuple("self" if i == j else "nvlink" for j in range(gpus))
                  for i in range(gpus)))
    view = ClusterView.__new__(ClusterView)
    view.backend, view.topology, view.topology_error = backend, Topology((node,)), None
    view.gpus_per_node, view.groups_per_gpu = gpus, groups_per_gpu
    return view


def test_placements_follow_the_topology():
    import dataclasses
    suite = load_suite(suite_path("nightly"))
    tp = {c.tp: c for c in suite.of("correctness")
          if c.op == "all_reduce_norm" and c.placement == "auto"}
    one, eight = _view(1), _view(8)
    assert [p.name for p in one.offered(tp[1])] == ["process-per-gpu"]
    assert [p.name for p in one.offered(tp[4])] == ["shared-gpu"]
    assert one.resolve(tp[4]).gpus_per_rank == 0.25 and not one.resolve(tp[4]).collective_speed
    assert [p.name for p in eight.offered(tp[4])] == ["process-per-gpu", "shared-gpu"]
    assert "needs 4 GPUs in one NVLink domain" in one.offered(
        dataclasses.replace(tp[4], placement="process-per-gpu"))
    # The nightly runs every placement offered, a single job the best, --placement narrows.
    cases = [tp[1], tp[4]]
    assert [c.placement for c in eight.concretize(cases, every=True)] == \
        ["process-per-gpu", "process-per-gpu", "shared-gpu"]
    assert [c.placement for c in eight.concretize(cases, every=False)] == \
        ["process-per-gpu", "process-per-gpu"]
    assert [c.placement for c in eight.concretize(cases, every=False, wanted=("shared-gpu",))] == \
        ["shared-gpu"]
    # The profile times a collective on process-per-GPU groups only: a shared-GPU
    # group is planned only where nothing else fits (its row says why it is skipped).
    prof = [dataclasses.replace(c, job="profile") for c in cases]
    assert [c.placement for c in eight.concretize(prof, every=True)] == \
        ["process-per-gpu", "process-per-gpu"]
    assert [c.placement for c in one.concretize(prof, every=True)] == \
        ["process-per-gpu", "shared-gpu"]
    emulated = _view(0, backend="emulated")
    assert [c.placement for c in emulated.concretize(cases, every=True)] == ["emulated"] * 2
    assert "needs the gpu backend" in emulated.offered(
        dataclasses.replace(tp[4], placement="shared-gpu"))
    # Virtual ranks: asked for, never chosen by auto; correctness only; GPU only.
    virtual = dataclasses.replace(tp[4], placement="virtual-ranks")
    assert [(p.name, p.gpus_per_rank, p.collective_speed) for p in one.offered(virtual)] == \
        [("virtual-ranks", 1.0, False)]
    assert "correctness job only" in one.offered(dataclasses.replace(virtual, job="faults"))
    assert "needs the gpu backend" in emulated.offered(virtual)
    assert "no GPU" in _view(0).offered(virtual)


def test_a_pool_prestarts_the_workers_of_the_largest_group_the_backend_runs():
    """The smoke suite's largest groups, tp 8, are virtual ranks (GPU only):
    emulated, its pool prestarts the 4 workers of its largest group run (tp
    4), not 8 (each one imports torch: seconds of CPU); a GPU prestarts for
    them, times the groups that may share a GPU."""
    from jobs.__main__ import prestart_count
    smoke = load_suite(suite_path("smoke")).cases
    assert max(c.tp for c in smoke) == 8
    assert prestart_count(smoke, _view(0, backend="emulated")) == 4
    assert prestart_count(smoke, _view(8)) == 8
    assert prestart_count(smoke, _view(8, groups_per_gpu=2)) == 16
    profile_only = [c for c in smoke if c.job == "profile"]  # not timed emulated: no group
    assert prestart_count(profile_only, _view(0, backend="emulated")) == 0
    assert prestart_count(profile_only, _view(1)) == 1


def test_kernel_only_fields_do_not_split_groups():
    """all_reduce_norm's mode picks the rank's kernel, not the group: the
    nightly's one_shot and owner cases of one (placement, tp, hidden) run on
    one group (one build, not two); a field that shapes the group still splits."""
    from cluster import ops
    assert ops.get("all_reduce_norm").fields["mode"].kernel_only
    assert not ops.get("all_reduce_mhc").fields["hc"].kernel_only
    cases = [c for c in load_suite(suite_path("nightly")).of("correctness")
             if c.op == "all_reduce_norm"]
    groups: dict = {}
    for c in cases:
        groups.setdefault(c.group_key, set()).add(dict(c.op_args)["mode"])
    assert set(map(frozenset, groups.values())) == {frozenset({"one_shot", "owner"})}
    assert len(groups) == len({(c.placement, c.tp, c.hidden) for c in cases})
    mhc = [c for c in load_suite(suite_path("nightly")).of("correctness")
           if c.op == "all_reduce_mhc"]
    split = dataclasses.replace(mhc[0], hc=(mhc[0].hc or 4) * 2)
    assert split.group_key != mhc[0].group_key


def test_one_gpu_groups_share_a_gpu_when_asked(monkeypatch):
    """--groups-per-gpu N: a shared-GPU or virtual-ranks group holds 1/N of
    its GPU (Ray's fractional GPUs, the fan-out's units), N such groups run
    on one GPU at once; process per GPU keeps whole GPUs."""
    import dataclasses

    from cluster.fanout import Fanout, Task
    from jobs.correctness import group_units
    from jobs.cluster_view import ClusterView
    from jobs.options import check_groups_per_gpu
    suite = load_suite(suite_path("nightly"))
    tp = {c.tp: c for c in suite.of("correctness")
          if c.op == "all_reduce_norm" and c.placement == "auto"}
    two = _view(2, groups_per_gpu=2)
    shared = dataclasses.replace(tp[4], placement="shared-gpu")
    virtual = dataclasses.replace(tp[4], placement="virtual-ranks")
    ppg = dataclasses.replace(tp[2], placement="process-per-gpu")
    assert two.resolve(shared).gpus_per_rank == 0.125 and group_units(shared, two) == 0.5
    assert two.resolve(virtual).gpus_per_rank == 0.5 and group_units(virtual, two) == 0.5
    assert two.resolve(ppg).gpus_per_rank == 1.0 and group_units(ppg, two) == 2.0
    assert group_units(shared, _view(2)) == group_units(virtual, _view(2)) == 1.0
    # Two GPUs, two groups a GPU: four one-GPU groups at once, never five.
    import cluster.fanout
    monkeypatch.setattr(cluster.fanout, "node_units", lambda backend: {"n0": 2.0})
    fan = Fanout.for_backend("gpu", per_unit=2)
    assert fan.max_parallel == 4 and Fanout.for_backend("gpu").max_parallel == 2
    fan._alive = lambda: {"n0"}
    import threading
    import time
    running, peak, lock = [0], [0], threading.Lock()

    def body(node):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
    fan.run([Task(f"g{i}", 0.5, body, lambda why: None) for i in range(8)])
    assert fan.peak == peak[0] == 4
    for bad in (0, 9, 1.5, True, "2"):
        with pytest.raises(ValueError, match="groups_per_gpu must be an integer in 1..8"):
            check_groups_per_gpu(bad)
    with pytest.raises(ValueError, match="got 0"):
        ClusterView("gpu", groups_per_gpu=0)  # refused before Ray is asked anything


def test_groups_per_gpu_is_checked_on_the_command_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "jobs", "correctness", "--suite", "smoke",
                           "--groups-per-gpu", "9", "--results", str(tmp_path / "r")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--groups-per-gpu: expected an integer in 1..8, got '9'" in done.stderr
    assert not (tmp_path / "r").exists()
