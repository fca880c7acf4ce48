"""Real runs with torch: the model zoo, the layer profiler and trace recording.

Importing this package does not import torch; the modules that need it import it
themselves (``realrun.profiler``, ``realrun.graph``, ``realrun.kineto``, the zoo's model
modules), so the command line can list models and parse flags without loading torch.
"""
