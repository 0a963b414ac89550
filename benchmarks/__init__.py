"""Benchmarks: scripts that write ``benchmarks/results/*.json``; never timed tests.

One entry point, ``python -m benchmarks.perf`` (see its ``--help``), holds the table of
suites (:data:`.perf.RUNNERS`) and runs them; each suite is a module of its own (``rope``
and ``attention`` in :mod:`.rope`, ``linear``, ``lowering``, ``fake_impls``, ``train_step``,
``step_bounds``, ``loss_study``, ``llama4``, ``te_conformance``, ``model_step``) and none
imports the entry point. What several suites share is in modules that import no suite:
:mod:`.steps` (the timed training steps, CUDA-graph capture, host time per step),
:mod:`.record` (the machine record and the files), :mod:`.gpu_clocks` and
:mod:`.host_breakdown`. Timing is :mod:`tetrt_support.report.timing`; the files are read
back by :mod:`tetrt_support.report.results`.
"""
