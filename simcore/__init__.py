"""dtsim's simulator core: a pure SimPy model of GPUs, links and training schemes.

No file I/O, printing, torch, click, pandas or plotting here. One entry point::

    from simcore import SimConfig, simulate
    result = simulate(SimConfig(trace=..., topology=TopologySpec(...), scheme="dp"))
"""

from simcore.config import ConfigError, SimConfig, options_from_mapping
from simcore.engine import SimulationError, simulate
from simcore.result import CONTRACT_KEYS, RunResult
from simcore.topology import GpuSpec, Topology, TopologyError, TopologySpec, build_topology

__all__ = [
    "CONTRACT_KEYS",
    "ConfigError",
    "GpuSpec",
    "RunResult",
    "SimConfig",
    "SimulationError",
    "Topology",
    "TopologyError",
    "TopologySpec",
    "build_topology",
    "options_from_mapping",
    "simulate",
]
