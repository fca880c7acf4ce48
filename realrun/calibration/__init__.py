"""Calibration of the simulator against this machine's (emulated) cluster (``sim calibrate``).

:func:`realrun.calibration.run.calibrate` runs microbenchmarks as real gloo processes, one
per emulated host, on the cluster ``sim real --cluster netns --bandwidth R`` would build (or
on loopback), fits what the simulator needs, and returns a topology preset;
:func:`realrun.calibration.preset.write_calibration` writes it as YAML for ``sim run
--topology FILE``. What is measured:

* **Unshaped ping-pong** between host 0 and each other host (``hosts`` hosts) on the
  cluster before it is shaped (or loopback): the CPU seconds each side spends per message
  (``resource.getrusage``: all threads, user and kernel time), fitted as
  ``message_cpu_s + n * copy_cpu_s_per_byte``; the wall-time fit is kept too.
* **Local compute**, one torch thread: float32 ``add_`` over sizes (CPU seconds per byte
  reduced), ``copy_`` of a large tensor (memory bandwidth) and a float32 matmul (peak FLOP/s).
* **Shaped ping-pong** after the links are shaped in place
  (:meth:`~realrun.netns.EmulatedCluster.set_rate`): the one-way time of a message of ``n``
  bytes is half the median round trip. The model is ``t(n) = latency_s + max(0, n -
  burst) / goodput``: the latency is the tiny messages' time, the goodput a robust fit's
  slope (:func:`~realrun.calibration.fits.fit_shaped_link`).
* **All-reduce** (``dist.all_reduce``, float32) over sizes on the first ``p`` hosts for each
  ``p`` of ``allreduce_ranks``, shaped: medians kept for validation.
* **Busy cores**: hosts 0 and 1 all-reduce 256 KiB and 1 MiB beside 0 and 2 .. hosts
  threads training a small convolution; the wait of a woken thread for a core
  (``host.wakeup_s``) is fitted by simulating it
  (:func:`~realrun.calibration.simfits.fit_wakeup`).
* **The scheduler**, first and without the cluster: ``cores + 1`` plain processes compute
  and sleep in turn (:mod:`realrun.scheduler`); the delay before an idle core takes over
  a thread queued on a busier one (``host.balance_s``) is fitted by simulating it.

The modules, in the order a calibration uses them:

* :mod:`~realrun.calibration.run`: :func:`~realrun.calibration.run.calibrate`, which
  starts the ranks on the cluster phase by phase and follows their progress;
* :mod:`~realrun.calibration.ranks`: the benchmarks each rank runs (``python -m
  realrun.calibration.ranks JOB.json``, with the environment ``torchrun`` would give it;
  the parent process never imports torch);
* :mod:`~realrun.calibration.fits`: the fits, pure numpy, and the rows they are fitted to;
* :mod:`~realrun.calibration.simfits`: the fits that simulate a benchmark on the
  calibrated preset and pick the value whose simulation matches it;
* :mod:`~realrun.calibration.preset`: the measurements fitted and laid out as a topology
  preset, and the YAML writer;
* :mod:`~realrun.calibration.report`: the short human summary ``sim calibrate`` prints.
"""

from __future__ import annotations

__all__ = ["CalibrationError", "KiB", "MiB"]

KiB = 1024
MiB = 1024 * 1024


class CalibrationError(RuntimeError):
    """A calibration could not be made; the message is one line saying why."""
