"""The Arrow results store: one row per case execution, as hive-partitioned Parquet.

See ``schema`` for the columns and their units, ``store`` for the on-disk
layout and its atomicity contract, ``compaction`` for the in-place
compaction and the protocol that keeps it from racing any reader.
"""

from jobs.results.environment import env_info, env_info_soon, git_commit
from jobs.results.schema import (BACKENDS, COLUMNS, JOBS, OUTCOMES, SCHEMA, SCHEMA_VERSION,
                                 SCHEMA_VERSION_KEY, TRIGGERS, Column, make_row,
                                 row_job, rows_to_table)
from jobs.results.store import (FILE_SCHEMA, READ_SCHEMA, ForeignFileWarning, QuarantineWarning,
                                ResultsError, ResultsWarning, ResultsWriter, list_runs,
                                new_run_id, read_results)
from jobs.results.compaction import compact, compact_run

__all__ = [
    "BACKENDS", "COLUMNS", "FILE_SCHEMA", "ForeignFileWarning", "JOBS", "OUTCOMES",
    "QuarantineWarning", "READ_SCHEMA", "ResultsError", "ResultsWarning", "SCHEMA",
    "SCHEMA_VERSION", "SCHEMA_VERSION_KEY", "TRIGGERS", "Column", "ResultsWriter",
    "compact", "compact_run", "env_info", "env_info_soon", "git_commit", "list_runs", "make_row", "new_run_id",
    "read_results", "row_job", "rows_to_table",
]
