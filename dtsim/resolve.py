"""Re-exports :mod:`analysis.resolve`, where names of models and presets become simulator
objects (the sweeps need it too, and they may not import the command line; the simulator
core reads no files, so it lives above it)."""

from analysis.resolve import (
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
