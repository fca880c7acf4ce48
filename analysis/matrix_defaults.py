"""The validation matrix's defaults, declared once for ``analysis.validate`` and the ``sim
validate`` command (a module without imports, so the command line starts fast)."""

RANKS = (2, 3, 4)
"""Rank counts a validation matrix cycles through."""

BATCH = 24
"""Samples per iteration and worker (a pipeline's mini-batch): divisible by 2, 3 and 4."""

ITERATIONS = 4
"""Measured iterations per real run (and per simulation), after the warm-up ones."""

WARMUP_ITERATIONS = 3
"""Iterations each run makes before it measures."""

REPEATS = 3
"""Real runs per case."""

SIM_SEEDS = 10
"""Simulations per real run, each with its own seed of compute jitter (their mean is the
run's simulated iteration time)."""

SIM_JITTER = 0.05
"""Coefficient of variation of each simulated op's CPU work in those simulations."""
