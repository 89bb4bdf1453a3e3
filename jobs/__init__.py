"""The jobs users run: ``python -m jobs <command>`` (see ``jobs.__main__``).

- :mod:`jobs.config`: suite configs (``jobs/suites/*.toml``), cases, filters;
- :mod:`jobs.session`: the Ray session, the backend, the worker pool;
- :mod:`jobs.cluster_view`: the cluster as the jobs see it, the placements
  it offers each case;
- :mod:`jobs.recorder`: the run recorder (result rows, the table and progress
  bar every job shares);
- :mod:`jobs.correctness`, :mod:`jobs.faults`, :mod:`jobs.profile`
  (timed through :mod:`cluster.measure`): the jobs;
- :mod:`jobs.regression`: the regression rule against the nightly history;
- :mod:`jobs.report`: print or compare runs;
- :mod:`jobs.selfcheck`, :mod:`jobs.compile_check`: the golden self-check and
  the kernel compile check;
- :mod:`jobs.results`: the Arrow results store.
"""
