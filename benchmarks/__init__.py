"""Benchmarks: scripts that write ``benchmarks/results/*.json``; never timed tests.

One entry point, ``python -m benchmarks.perf`` (see its ``--help``), runs every suite:
``lowering`` (this module's :mod:`.lowering`), ``rope`` and ``attention`` (:mod:`.rope`),
``linear`` (:mod:`.linear`) and ``fake_impls`` (:mod:`.fake_impls`). Timing is
:mod:`tetrt_support.report.timing`; the files are read back by
:mod:`tetrt_support.report.results`; :mod:`.record` writes them.
"""
