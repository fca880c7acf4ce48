"""The parts of a validation, which :mod:`analysis.validate` runs case by case.

* :mod:`~analysis.validation.matrix`: the cases and the matrices made of them;
* :mod:`~analysis.validation.harness`: a case as a simulated configuration and as a real
  job, the runner of real jobs on an emulated cluster, the real runs' kept records;
* :mod:`~analysis.validation.inputs`: what a prediction is made from: the cluster's
  calibration and the model's profile;
* :mod:`~analysis.validation.prediction`: the prediction of a case before its real runs,
  and the registered predictions;
* :mod:`~analysis.validation.replay`: each real run simulated again on what it measured;
* :mod:`~analysis.validation.rows`: a case's row of the table and the errors over rows;
* :mod:`~analysis.validation.report`: ``report.md``, its scatter and its timelines.
"""
