"""The fixed-width tables (jobs/table.py) never cut a name: the job and op
columns are as wide as the longest job and registered op, and any longer
text pushes its row right instead of losing its end."""

import io

from cluster import ops
from jobs.recorder import COLUMNS
from jobs.results.schema import JOBS
from jobs.table import Col, Table


def test_every_job_and_op_name_fits_its_column_and_nothing_is_cut():
    out = io.StringIO()
    table = Table([*COLUMNS[:2], Col("note", 4)], out=out)
    for job in JOBS:
        for op in ops.names():
            table.row([job, op, "longer than four"])
    header, _, *lines = out.getvalue().splitlines()
    assert header.split() == ["job", "op", "note"]
    assert len(lines) == len(JOBS) * len(ops.names())
    for line, (job, op) in zip(lines, [(j, o) for j in JOBS for o in ops.names()]):
        assert line.split()[:2] == [job, op]  # whole: compile-check, finalize_publish
        assert line.index(op) == COLUMNS[0].width + 2  # the op column starts where it should
        assert line.rstrip().endswith("longer than four")
