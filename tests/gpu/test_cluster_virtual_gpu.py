"""The jobs' virtual-ranks placement on one GPU (cluster.gpu.virtual.run_group,
no Ray): an M sequence on one set of mailboxes, the first call eager with a
zero residual (the sum observed bit for bit), the later calls replays of one
CUDA graph with new data, every output checked, mailboxes all sentinel.

    timeout 300 python -m pytest -m gpu tests/gpu/test_cluster_virtual_gpu.py -v
"""

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tp", [2, 8])
@pytest.mark.parametrize("inputs", ["random", "order_sensitive", "sentinel_pattern"])
def test_m_sequence_eager_then_graph_replays_match_the_reference(tp, inputs):
    from cluster.gpu.virtual import run_group

    tokens = [1, 5, 16, 3]
    out = run_group({"tp": tp, "hidden": 2048, "capacity": 16, "eps": 1e-6,
                     "budget_ns": 1_000_000_000,
                     "cases": [{"tokens": m, "inputs": inputs, "seeds": [10 * m, 10 * m + 1,
                                                                         10 * m + 2]}
                               for m in tokens]})
    assert [c["tokens"] for c in out["cases"]] == tokens
    for case in out["cases"]:
        calls = case["calls"]
        assert [c["graph"] for c in calls] == [False, True, True]
        for call in calls:
            assert call["diagnosis"] is None and call["mailbox_clean"]
            assert len(call["checks"]) == tp
            for check in call["checks"]:
                assert check["ok"], check
                assert check["residual"]["mismatches"] == 0 and check["norm"]["max_ulp"] <= 1
        # call 0 has a zero residual: the reduced sum itself is compared bit for bit
        assert all(c["sum"]["mismatches"] == 0 for c in calls[0]["checks"])
        assert all(c["sum"] == {"observed": False} for c in calls[1]["checks"])
