"""dtsim: predict distributed DNN training before booking the GPUs.

This package is the edge of the tool: :mod:`dtsim.cli`, the ``sim`` command. Nothing
imports it. What a person asks for (:mod:`simcore.spec`) and how names become simulator
objects (:mod:`analysis.resolve`) live below it, re-exported as :mod:`dtsim.spec` and
:mod:`dtsim.resolve`. The simulator itself is :mod:`simcore`; traces are :mod:`traces`;
see docs/architecture.md.
"""

from simcore.version import __version__

__all__ = ["__version__"]
