"""Analysis on top of the simulator: what-if sweeps (:mod:`analysis.sweep`), their
storage (:mod:`analysis.store`), plots (:mod:`analysis.plots`) and the papers' report
(:mod:`analysis.report`).

Importing this package imports nothing heavy; pandas, seaborn, joblib and dask are
imported by the functions that need them.
"""
