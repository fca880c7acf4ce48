"""dtsim: predict distributed DNN training before booking the GPUs.

This package is the edge of the tool: :mod:`dtsim.spec` (what a person asks for),
:mod:`dtsim.resolve` (names and files to simulator objects) and :mod:`dtsim.cli` (the
``sim`` command). The simulator itself is :mod:`simcore`; traces are :mod:`traces`.
"""

__version__ = "0.1.0"
