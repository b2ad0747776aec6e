"""``lrft bench``: throughput of the real trainer components on fixed workloads.

- :mod:`lrft.bench.workloads`: workloads as data (JSON; built-in ``w1``, ``w2``, ``qwen2-1.5b``, ``tiny``,
  ``w2-ragged``);
- :mod:`lrft.bench.ragged`: responses forced to ragged lengths, and the ideal they are measured
  against;
- :mod:`lrft.bench.grpo`: the end-to-end GRPO loop of ``lrft train``, per phase;
- :mod:`lrft.bench.train_mfu`: the policy update alone, as model FLOPs utilisation;
- :mod:`lrft.bench.sync`: weight sync and engine sleep/wake;
- :mod:`lrft.bench.ceilings`: the device's ceilings, measured in the same run;
- :mod:`lrft.bench.run`: the command (``lrft bench MODE``) and its JSON document.

``docs/benchmarks.md`` explains every figure and formula.
"""

from lrft.bench.run import DEFAULT_WORKLOADS, MODES, BenchSettings, run
from lrft.bench.workloads import BUILT_IN, PARTS, Workload, load_workload

__all__ = [
    "BUILT_IN",
    "DEFAULT_WORKLOADS",
    "MODES",
    "PARTS",
    "BenchSettings",
    "Workload",
    "load_workload",
    "run",
]
