"""scripts/gpu/ncu_summary.py on a small report in ncu's CSV shapes
(details page: one row a metric; raw page: header, units, one row a launch)."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "ncu_summary", ROOT / "scripts/gpu/ncu_summary.py")
S = importlib.util.module_from_spec(spec)
spec.loader.exec_module(S)

DETAILS = '''"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","kernel_cutlass_fused_kernel","GPU Speed Of Light Throughput","Duration","us","3.10","rule","x"
"0","1","kernel_cutlass_fused_kernel","GPU Speed Of Light Throughput","DRAM Throughput","%","41.2"
"0","1","kernel_cutlass_fused_kernel","Launch Statistics","Grid Size","","80"
"0","1","kernel_cutlass_fused_kernel","Launch Statistics","Shared Memory Configuration Size","KB","8"
"1","1","kernel_cutlass_kernel","GPU Speed Of Light Throughput","Duration","us","2.50"
'''
RAW = '''"ID","Kernel Name","launch__grid_size","dram__bytes_read.sum","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum","l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
"","","","Mbyte","ratio","ratio","sector","sector"
"0","kernel_cutlass_fused_kernel","80","9.20","0.5","12.25","143360","12"
"1","kernel_cutlass_kernel","40","4.60","3.0","1.0","71680","6"
'''


def test_summary_blocks(tmp_path):
    (tmp_path / "l.txt").write_text("==PROF== x\nncu launch: fused load-all* K=7168 M=1 x1\n"
                                    "ncu launch: projection w4s8 K=7168 M=1 x1\n")
    (tmp_path / "d.csv").write_text(DETAILS)
    (tmp_path / "r.csv").write_text(RAW)
    rc = S.main([str(tmp_path / n) for n in ("l.txt", "d.csv", "r.csv")])
    assert rc == 0


def test_summary_text(tmp_path):
    (tmp_path / "d.csv").write_text(DETAILS)
    (tmp_path / "r.csv").write_text(RAW)
    text = S.summary(["fused a", "projection b"], S.details(str(tmp_path / "d.csv")),
                     S.raw(str(tmp_path / "r.csv")))
    blocks = text.split("\n[")
    assert blocks[0].startswith("[0] fused a") and blocks[1].startswith("1] projection b")
    assert "Duration: 3.10 us" in blocks[0] and "Grid Size: 80" in blocks[0]
    assert "Shared Memory Configuration Size" not in text  # not selected
    assert "dram__bytes_read.sum: 9.20 Mbyte" in blocks[0]
    assert "kernel: kernel_cutlass_fused_kernel" in blocks[0]
    assert "launch__grid_size: 80" in blocks[0] and "launch__grid_size: 40" in blocks[1]
    # the loads' L1 sectors are kept, the stores' are not selected
    assert "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum: 143360 sector" in blocks[0]
    assert "op_st" not in text
    assert "stalls (warps per issue): long_scoreboard 12.25, barrier 0.50" in blocks[0]
    assert "stalls (warps per issue): barrier 3.00, long_scoreboard 1.00" in blocks[1]
    assert "note:" not in text
    assert "note: 1 launches listed, 2 profiled" in S.summary(
        ["x"], S.details(str(tmp_path / "d.csv")), S.raw(str(tmp_path / "r.csv")))
