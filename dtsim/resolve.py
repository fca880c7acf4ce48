"""Re-exports :mod:`simcore.resolve`, where names of models and presets are resolved (the
sweeps and the real runs need it too, and they may not import the command line)."""

from simcore.resolve import (
    build_config,
    device_scale,
    gpu_peak_flops,
    load_preset,
    resolve_trace,
    topology_presets,
)

__all__ = [
    "build_config",
    "device_scale",
    "gpu_peak_flops",
    "load_preset",
    "resolve_trace",
    "topology_presets",
]
