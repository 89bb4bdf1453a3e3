"""Topology: fake clusters planned into TP layouts; a real discovery on a CPU
machine returns zero GPUs without error."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.discovery import GpuInfo, NodeInfo, discover_node
from cluster.topology import Topology, discover_local, fake_node


def names(topo):
    return [lay.name for lay in topo.plan() if lay.placement == "process-per-gpu"]


def test_one_hgx_node_hosts_every_tp_layout():
    topo = Topology((fake_node("n0", 8),))
    assert names(topo) == ["8xTP1", "4xTP2", "2xTP4", "1xTP8"]
    tp4 = topo.layout(4)
    assert [g.gpus for g in tp4.groups] == [tuple(("n0", i) for i in range(4)),
                                           tuple(("n0", i) for i in range(4, 8))]
    assert all(g.strategy == "STRICT_PACK" and not g.cross_node for g in tp4.groups)
    assert tp4.groups[0].bundles() == [{"GPU": 1.0}] * 4
    assert not any(lay.skipped for lay in topo.plan())


def test_one_gpu_machine_plans_tp1_and_the_one_gpu_placements():
    topo = Topology((fake_node("h200", 1),))
    assert names(topo) == ["1xTP1", "0xTP2", "0xTP4", "0xTP8"]
    tp2 = topo.layout(2)
    assert any("needs 2 GPUs in one NVLink domain; the largest domain has 1" in s.reason
               for s in tp2.skipped)
    shared = topo.layout(4, "shared-gpu")
    (g,) = shared.groups
    assert g.gpus == (("h200", 0),) * 4 and g.gpus_per_rank == 0.25
    assert g.bundles() == [{"GPU": 1.0}]
    assert shared.name == "1xTP4 shared-GPU"
    assert topo.layout(8, "virtual-ranks").groups[0].gpus == (("h200", 0),) * 8
    with pytest.raises(ValueError, match="tp > 1 only"):
        topo.layout(1, "shared-gpu")
    with pytest.raises(ValueError, match=r"tp sizes \[3\] not supported"):
        topo.plan((3,))
    with pytest.raises(ValueError, match="unknown placement 'mps'"):
        topo.layout(2, "mps")


def test_two_nodes_without_nvlink_between_them_never_form_cross_node_groups():
    topo = Topology((fake_node("a", 4), fake_node("b", 4)))
    assert names(topo) == ["8xTP1", "4xTP2", "2xTP4", "0xTP8"]
    assert all(not g.cross_node for lay in topo.plan() for g in lay.groups)
    reasons = [s.reason for s in topo.layout(8).skipped]
    assert any("needs 8 GPUs in one NVLink domain; the largest domain has 4" in r for r in reasons)
    assert any("has 4 GPUs: 4 left over after 0 x TP8" in r for r in reasons)


def test_multi_node_nvlink_fabric_spans_nodes():
    topo = Topology((fake_node("a", 4, fabric_cluster="c1"), fake_node("b", 4, fabric_cluster="c1")))
    (g,) = topo.layout(8).groups
    assert g.cross_node and g.nodes == ("a", "b") and g.strategy == "PACK"
    assert [len(x.groups) for x in topo.plan()[:4]] == [8, 4, 2, 1]


def test_pcie_only_gpus_are_skipped_with_the_reason():
    topo = Topology((fake_node("p", 4, links="pcie"),))
    assert names(topo) == ["4xTP1", "0xTP2", "0xTP4", "0xTP8"]
    reasons = " ".join(s.reason for s in topo.layout(2).skipped)
    assert "p:0 peers over pcie only" in reasons


def test_partial_nvlink_leftovers_are_recorded():
    # 6 GPUs: 0-3 all-to-all NVLink, 4-5 NVLink pair, PCIe between the sets.
    links = [["self" if i == j else "nvlink" if (i < 4) == (j < 4) else "pcie"
              for j in range(6)] for i in range(6)]
    topo = Topology((fake_node("m", 6, links=links),))
    assert topo.domains() == (tuple(("m", i) for i in range(4)), (("m", 4), ("m", 5)))
    tp4 = topo.layout(4)
    assert len(tp4.groups) == 1
    assert any("2 left over after 0 x TP4" in s.reason and s.gpus == (("m", 4), ("m", 5))
               for s in tp4.skipped)
    assert len(topo.layout(2).groups) == 3


def test_summary_is_json_and_round_trips():
    topo = Topology((fake_node("a", 2, multicast=True), fake_node("b", 1)))
    summary = json.loads(topo.to_json())
    assert summary["gpu_count"] == 3 and summary["gpu_models"] == ["NVIDIA H200"]
    assert summary["multicast_supported"] is False  # not every GPU reports it
    assert summary["nvlink_domains"] == [["a:0", "a:1"], ["b:0"]]
    assert {"name": "1xTP2", "tp": 2, "placement": "process-per-gpu", "groups": [["a:0", "a:1"]],
            "skipped": summary["layouts"][1]["skipped"]} == summary["layouts"][1]
    assert Topology.from_summary(summary) == topo
    hash(topo)


def test_bad_topologies_are_rejected_with_values():
    gpu = GpuInfo(index=0, name="x", uuid="u", memory_bytes=1, sm_count=1, compute_capability=(9, 0))
    with pytest.raises(ValueError, match=r"p2p must be 1 x 1 for 1 GPUs, got \[\]"):
        NodeInfo(node_id="n", hostname="n", gpus=(gpu,), p2p=())
    with pytest.raises(ValueError, match=r"unknown p2p links \['xgmi'\]"):
        NodeInfo(node_id="n", hostname="n", gpus=(gpu,), p2p=(("xgmi",),))
    with pytest.raises(ValueError, match="node ids must be distinct"):
        Topology((fake_node("a", 1), fake_node("a", 1)))
    assert gpu.arch == "sm_90a"


def test_real_discovery_on_a_cpu_machine_finds_no_gpu_without_error():
    node = discover_node()
    assert node.gpus == () and node.p2p == ()
    versions = dict(node.versions)
    assert versions["torch"] and versions["ray"] and "python" in versions
    topo = discover_local()
    assert topo.gpu_count == 0
    summary = json.loads(topo.to_json())
    assert all(lay["groups"] == [] and lay["skipped"] == ["the cluster has no GPU"]
               for lay in summary["layouts"])


def test_discovery_on_a_cpu_node_reads_torchs_cuda_version_without_importing_it():
    """Every job's discovery task runs it: torch's import there cost
    seconds of CPU per job and told nothing on a node without GPUs."""
    probe = ("import sys\n"
             "from cluster.discovery import discover_node\n"
             "v = dict(discover_node().versions)\n"
             "assert 'torch' not in sys.modules, 'discovery imported torch'\n"
             "import torch\n"
             "assert v['torch_cuda'] == (torch.version.cuda or ''), v\n"
             "assert v['nccl'] == '', v\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_torchs_cuda_version_is_read_from_its_version_file(tmp_path, monkeypatch):
    from cluster import discovery
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('never imported')\n")
    (fake / "version.py").write_text("from typing import Optional\n"
                                     "__version__ = '9.9'\ncuda: Optional[str] = '12.8'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert discovery.torch_cuda_version() == "12.8"
    (fake / "version.py").write_text("cuda = None\n")
    assert discovery.torch_cuda_version() == ""
