"""Real runs with torch: the model zoo, the layer profiler, trace recording, and the real
runtimes of the training schemes.

* :mod:`realrun.zoo`, :mod:`realrun.graph`, :mod:`realrun.profiler`, :mod:`realrun.kineto`:
  models, their layer graphs, and traces measured from them; :mod:`realrun.usermodel`:
  users' own models by reference (``FILE.py:NAME``); :mod:`realrun.machine`: what machine
  measured a trace (no torch);
* :mod:`realrun.job`, :mod:`realrun.spec`: what a real run does (no torch);
* :mod:`realrun.launch`: starts one process per rank, watches them, names a rank that dies
  or hangs (no torch); :mod:`realrun.netns`: the emulated cluster (no torch);
* :mod:`realrun.worker` (``python -m realrun``), :mod:`realrun.runtime` and
  :mod:`realrun.schemes`: one rank's work;
* :mod:`realrun.metrics`: the measured result from the ranks' records (no torch).
* :mod:`realrun.calibration`: ``sim calibrate``'s microbenchmarks and fits, a topology
  file of this machine's cluster (its ranks import torch, the package itself does not).

Importing this package does not import torch; the modules that need it import it
themselves, so the command line can list models and parse flags without loading torch.
"""
