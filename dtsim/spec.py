"""Re-exports :mod:`simcore.spec`, where the run settings are declared (the sweeps and the
real runs need them too, and they may not import the command line)."""

from analysis.resolve import load_config_file
from simcore.spec import (
    DEFAULT_GPUS,
    DEFAULT_TOPOLOGY,
    FIELDS,
    FLAG_FIELDS,
    RunSpec,
    apply_settings,
    flag_fields,
    parse_set,
)

__all__ = [
    "DEFAULT_GPUS",
    "DEFAULT_TOPOLOGY",
    "FIELDS",
    "FLAG_FIELDS",
    "RunSpec",
    "apply_settings",
    "flag_fields",
    "load_config_file",
    "parse_set",
]
