"""Notebook and report helpers: the showcase around the shipped pipeline.

Tables, numeric comparisons, timing, the readers of ``benchmarks/results/*.json`` and the
graph inventories the notebooks print. Nothing here is part of ``compile``. Importing this
package (or :mod:`.tables`, :mod:`.timing`, :mod:`.results`, :mod:`.perf`) loads neither the
lowering and compiler wing nor the quantization wing: the helpers that need one import it
inside the function that uses it.

Modules: ``abstract`` (each notebook's answer and the figures of its abstract), ``tables``
(:class:`Table`, :func:`collapsed`), ``timing`` (the one timer), ``compare``
(``max_abs_error``), ``results`` (the one results-file reader), ``perf`` (benchmark
tables and claims), ``complex_graphs`` (graph inventories and the strategy comparison),
``quant_tracing`` and ``fake_impl_measure`` (how quantizers and fake impls trace),
``distributed_training`` (runs across gloo ranks).
"""

from tetrt_support.report.tables import Table, collapsed, format_table

__all__ = ["Table", "collapsed", "format_table"]
