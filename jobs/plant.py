"""A calibrated slowdown planted on the GPU, for ``scripts/gpu/detection_power.sh``
alone (issue 66): ``python -m jobs profile ... --plant-slowdown PCT``, a
hidden option.

Each timed case's fused kernel (``all_reduce_norm`` at tp 1, one-shot: the
single kernel, :mod:`kernels.lamport.norm_single`) is built to spin
``PCT`` % of that case's A/A median before its payload stores: the median
of its nightly history in ``--results`` (the script's A/A nights, at least
``min_history`` of them). The spin counts SM cycles (``%clock64``; the
kernel says why not ``%globaltimer``), so the delay in ns is turned into
cycles with the SM clock the A/A rows recorded (the median of
``sm_clock_mhz_after``, read right after each case's replays, else
``_before``). What the slowdown came to is measured, not assumed:
``python -m jobs.power`` reports each step's planted median over the A/A one.

Never a real night: a planted run is refused unless it is ``jobs profile``
with ``--trigger adhoc`` and rows (so no nightly history, lookback or
change point ever reads it: those read ``trigger = nightly`` alone), and
every row of a planted case carries ``extra.planted_pct`` (and the delay:
``plant_delay_ns``, ``plant_delay_cycles``, ``plant_aa_median_us``,
``plant_sm_clock_mhz``), which :mod:`jobs.power` reads. Bad use is a
:class:`jobs.config.ConfigError` naming the option (exit 2, before Ray).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from collections.abc import Sequence

OPTION = "--plant-slowdown"
MAX_PCT = 50.0
"""The largest planted step, in %: the script plants 1-10 %."""
OP = "all_reduce_norm"


def pct(text: str) -> float:
    """:data:`OPTION`'s value: a percentage in (0, :data:`MAX_PCT`];
    ConfigError naming it otherwise."""
    from jobs.config import ConfigError
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_PCT):
        raise ConfigError(f"{OPTION} {text!r}: a percentage in (0, {MAX_PCT:g}]")
    return value


def add_argument(p: argparse.ArgumentParser) -> None:
    """The hidden option (not in ``--help``): every sweep command parses it
    (checked by :func:`calibrate`), so that one line refuses it anywhere but
    ``jobs profile``."""
    p.add_argument(OPTION, dest="plant_slowdown", default=None, help=argparse.SUPPRESS)


@dataclasses.dataclass(frozen=True)
class Plant:
    """One case's planted delay."""
    pct: float
    aa_median_us: float
    aa_nights: int
    sm_clock_mhz: float
    delay_ns: float
    delay_cycles: int

    def extra(self) -> dict:
        """What every row of the case carries (the module docstring)."""
        return {"planted_pct": self.pct, "plant_delay_ns": round(self.delay_ns, 3),
                "plant_delay_cycles": self.delay_cycles,
                "plant_aa_median_us": self.aa_median_us, "plant_aa_nights": self.aa_nights,
                "plant_sm_clock_mhz": self.sm_clock_mhz}


def key(case) -> tuple:
    """A case's identity for its plant: the A/A rows' timing identity,
    placement left out (the sweep makes an ``auto`` placement concrete after
    the calibration, which changes ``case.key()``)."""
    return (case.op, case.variant, case.transport, case.tp, case.hidden, case.tokens)


def calibrate(args, plan) -> dict[tuple, Plant]:
    """:func:`key` ``-> Plant`` for every case of ``plan`` (the sweep's
    ``(suite, cases)`` pairs), or {} without the option; ConfigError
    (naming :data:`OPTION`) on any use but the script's."""
    from jobs.config import ConfigError
    text = getattr(args, "plant_slowdown", None)
    if text is None:
        return {}
    value = pct(text)
    said = f"{OPTION} {value:g}"
    if getattr(args, "cmd", None) != "profile":
        raise ConfigError(f"{said}: only `jobs profile` plants a slowdown (for "
                          f"scripts/gpu/detection_power.sh); `jobs {args.cmd}` never does")
    if args.trigger != "adhoc":
        raise ConfigError(f"{said}: a planted night is never a real one; it needs --trigger "
                          f"adhoc, got --trigger {args.trigger}")
    if args.no_results:
        raise ConfigError(f"{said}: needs --results holding the A/A nights (and writes the "
                          f"planted rows there); drop --no-results")
    cases = [(suite.name, c) for suite, cs in plan for c in cs]
    for _, case in cases:
        mode = case.op_fields().get("mode", "one_shot")
        if case.op != OP or case.tp != 1 or mode != "one_shot" or case.transport != "unicast":
            raise ConfigError(f"{said}: {case.label()}: only {OP} at tp 1, one-shot, unicast "
                              f"carries a planted delay (the single kernel); select with "
                              f"--ops {OP} --tp 1")
    return aa_calibration(args.results, cases, value, said=said)


def aa_calibration(results, cases: Sequence[tuple], pct: float, *,
                   said: str) -> dict[tuple, Plant]:
    """Each ``(suite name, case)``'s :class:`Plant` from its nightly (A/A)
    rows in ``results``."""
    from jobs import regression as rg
    from jobs.config import ConfigError
    from jobs.timings import METRIC, timed_rows
    from jobs.results import read_results
    from jobs.results.runs import BASELINE_STATUSES
    need = rg.Rule().min_history
    try:
        rows = timed_rows(read_results(results))
    except Exception as err:  # noqa: BLE001 - an unreadable folder is bad input here
        raise ConfigError(f"{said}: --results {results}: {err}") from None
    by_case: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        if r["trigger"] == "nightly" and r.get("backend") == "gpu" and \
                r.get("run_status", "unrecorded") in BASELINE_STATUSES:
            k = (r["suite"], r["op"], r["variant"], r["transport"], r["tp"], r["hidden"],
                 r["tokens"])
            by_case.setdefault(k, {}).setdefault(r["run_id"], []).append(r)
    out = {}
    for suite, case in cases:
        k = (suite, case.op, case.variant, case.transport, case.tp, case.hidden,
             case.tokens)
        runs = by_case.get(k, {})
        gpus = {r.get("gpu_model") for rs in runs.values() for r in rs}
        if len(runs) < need:
            raise ConfigError(f"{said}: {case.label()}: {len(runs)} A/A night(s) in --results "
                              f"{results}, the calibration needs >= {need} (run the A/A "
                              f"nights first)")
        if len(gpus) > 1:
            raise ConfigError(f"{said}: {case.label()}: --results {results} holds nights of "
                              f"several GPU models {sorted(map(str, gpus))}: use one GPU's")
        medians = [statistics.median(r[METRIC] for r in rs) for rs in runs.values()]
        clocks = [c for rs in runs.values() for r in rs
                  for c in (r.get("sm_clock_mhz_after") or r.get("sm_clock_mhz_before"),)
                  if c]
        if not clocks:
            raise ConfigError(f"{said}: {case.label()}: its A/A rows record no SM clock "
                              f"(sm_clock_mhz_after/_before): the delay is spun in cycles")
        aa = statistics.median(medians)
        clock = float(statistics.median(clocks))
        delay_ns = pct / 100 * aa * 1000
        out[key(case)] = Plant(pct=pct, aa_median_us=aa, aa_nights=len(runs),
                                sm_clock_mhz=clock, delay_ns=delay_ns,
                                delay_cycles=max(1, round(delay_ns * clock / 1000)))
    return out


def describe(plants: dict[tuple, Plant]) -> str:
    """One line for the run's log."""
    if not plants:
        return ""
    p = next(iter(plants.values()))
    ns = sorted(x.delay_ns for x in plants.values())
    return (f"PLANTED SLOWDOWN +{p.pct:g} % (test-only, jobs/plant.py): {len(plants)} case(s), "
            f"{ns[0]:.1f}-{ns[-1]:.1f} ns spun before the payload stores at "
            f"{p.sm_clock_mhz:g} MHz; rows marked extra.planted_pct, trigger adhoc")
