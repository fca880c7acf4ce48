"""The validation matrix's defaults, declared once for ``analysis.validate`` (and its parts
in ``analysis.validation``) and the ``sim validate`` command (a module without imports, so
the command line starts fast)."""

RANKS = (2, 3, 4)
"""Rank counts a validation matrix cycles through."""

BATCH = 24
"""Samples per iteration and worker (a pipeline's mini-batch): divisible by 2, 3 and 4."""

ITERATIONS = 4
"""Measured iterations per real run (and per simulation), after the warm-up ones: at least
this many (see :data:`MIN_MEASURED_S`)."""

MIN_MEASURED_S = 1.0
"""Seconds each real run measures at least: a case whose predicted iteration is short makes
more measured iterations (up to :data:`MAX_ITERATIONS`). One iteration of a pipeline that
takes 10-40 ms here varies by a quarter from the next (the shared cores' scheduling), so
the mean of four of them was 20-37% apart between repeats."""

MAX_ITERATIONS = 100
"""The most measured iterations :data:`MIN_MEASURED_S` asks a run for."""

WARMUP_ITERATIONS = 3
"""Iterations each run makes before it measures."""

REPEATS = 3
"""Real runs per case."""

SIM_SEEDS = 10
"""Simulations per real run, each with its own seed of compute jitter (their mean is the
run's simulated iteration time)."""

SIM_JITTER = 0.05
"""Coefficient of variation of each simulated op's CPU work in those simulations."""

FAIL_ABOVE = 0.10
"""The median |relative error| of the predicted iteration time above which ``sim validate``
exits 1."""

FAIL_ABOVE_MAX = 0.25
"""The largest |relative error| of a predicted iteration time above which ``sim validate``
exits 1."""
