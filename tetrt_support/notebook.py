"""The one set-up call at the top of every notebook.

nbval compares every stored output, stderr included, so everything that could make a
replay differ is pinned here: the RNG state, print options, warning filters, the matplotlib backend
and figure format, a private inductor cache (why: ``docs/architecture.md``, section 5) and
progress bars. Stored errors are kept short, free of machine paths and wrapped to
``OUTPUT_WIDTH`` (``docs/architecture.md``, section 6).
"""

from __future__ import annotations

import atexit
import functools
import linecache
import os
import pathlib
import random
import re
import shutil
import site
import sysconfig
import tempfile
import textwrap
import warnings
from types import TracebackType
from typing import Any

from tetrt_support.report.tables import OUTPUT_WIDTH  # the one page width: tables fit it, errors wrap to it

_INDUCTOR_CACHE: str | None = None
_CACHE_PREFIX = "tetrt-inductor-"
# Sentences of a library's message that send the reader to frames a short error leaves out.
_STACK_TRACE_REFERENCE = re.compile(
    r" *\(?(?:Refer to the full stack trace above|See the stack trace)[^.\n]*\.\)?")
_CELL_FILE = re.compile(r"""[^\s"'()]*ipykernel_\d+[/\\]\d+\.py""")


def private_inductor_cache() -> str:
    """Point TORCHINDUCTOR_CACHE_DIR at a fresh directory owned by this process.

    The directory is removed when the process exits. A process that is killed (nbval
    stops its kernels that way) cannot clean up after itself, so each new one also
    removes the directories of processes that no longer exist: the process id is part
    of the name.
    """
    global _INDUCTOR_CACHE
    if _INDUCTOR_CACHE is None:
        _remove_stale_caches()
        _INDUCTOR_CACHE = tempfile.mkdtemp(prefix=f"{_CACHE_PREFIX}{os.getpid()}-")
        atexit.register(shutil.rmtree, _INDUCTOR_CACHE, True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE
        os.environ["TRITON_CACHE_DIR"] = os.path.join(_INDUCTOR_CACHE, "triton")
    return _INDUCTOR_CACHE


def _remove_stale_caches() -> None:
    pattern = re.compile(rf"{re.escape(_CACHE_PREFIX)}(\d+)-")
    for entry in pathlib.Path(tempfile.gettempdir()).glob(f"{_CACHE_PREFIX}*"):
        match = pattern.match(entry.name)
        if match and not _process_exists(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def setup(seed: int = 0, *, short_tracebacks: bool = True) -> None:
    """Make a notebook's outputs reproducible, its stderr quiet and its errors short.

    ``short_tracebacks=False`` keeps IPython's full tracebacks (for debugging a cell).
    """
    private_inductor_cache()
    os.environ.setdefault("TQDM_DISABLE", "1")

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=110)
    np.set_printoptions(precision=4, suppress=True, linewidth=110)

    # Known, understood warnings that would otherwise land in (compared) stderr.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
    warnings.filterwarnings("ignore", message=".*Casting complex values to real discards.*")
    warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets
    # A warning that does reach stderr is shown as "Category: message", with no file path.
    warnings.formatwarning = _format_warning
    import logging

    for name in ("torch._dynamo", "torch._inductor", "torch.onnx", "onnxscript", "torch.export"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # torchao (the bench extra), imported by transformers where installed, registers Enums
    # with a pytree call this torch deprecates: one logged line per Enum, in any cell.
    pytree_log = logging.getLogger("torch.utils._pytree")
    if _drop_enum_register_constant not in pytree_log.filters:
        pytree_log.addFilter(_drop_enum_register_constant)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    shell = _ipython()
    if shell is not None:
        _set_short_tracebacks(shell, short_tracebacks)
    _set_up_matplotlib(shell)


def _drop_enum_register_constant(record: Any) -> bool:
    """False (drop) for torch's deprecation of ``register_constant`` on an Enum subclass."""
    return "Calling register_constant() on Enum subclasses is deprecated" not in record.getMessage()


def _ipython() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _set_up_matplotlib(shell: Any) -> None:
    """Readable figures in the collection's style (:data:`FIGURE_STYLE`), stored as retina PNG.

    PNG, not SVG: nbval does not compare PNG bytes, while SVG text (glyph paths, ids)
    changes with the matplotlib and FreeType versions. A plot's claim is printed beside it.
    """
    try:
        import matplotlib
    except ImportError:
        return
    if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
        matplotlib.use("module://matplotlib_inline.backend_inline")
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("retina")
        _describe_figures_for_alt_text()
    else:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(FIGURE_STYLE)


# The page column of the rendered site (docs/_static/tetrt.css: 62em) is about 892 CSS px.
PAGE_WIDTH_PX = 892
# One figure style for the collection. At 100 dpi a figure is shown at its size in CSS px
# (a retina PNG stores twice the pixels), so 8 inches is 800 px: it fits the column unscaled
# and a 9 pt label stays 9 pt on the page. No text below 9 pt: ticks and legends 9, labels
# and titles 10. Wider figures (two panels) keep to FIGURE_MAX_WIDTH_IN.
FIGURE_DPI = 100
FIGURE_MAX_WIDTH_IN = PAGE_WIDTH_PX / FIGURE_DPI
MIN_FONT_PT = 9
FIGURE_STYLE: dict[str, Any] = {
    "figure.dpi": FIGURE_DPI,
    "figure.figsize": (8.0, 4.0),
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "xtick.labelsize": MIN_FONT_PT,
    "ytick.labelsize": MIN_FONT_PT,
    "legend.fontsize": MIN_FONT_PT,
    "legend.framealpha": 0.9,
}


def figure_alt_text(fig: Any) -> str:
    """A figure's words for a reader who cannot see it: its titles (the figure's, then each
    panel's), or, for an untitled panel, what it plots against what."""
    parts = []
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and suptitle.get_text():
        parts.append(suptitle.get_text())
    for ax in fig.axes:
        title = ax.get_title() or ax.get_title("left")
        if title:
            parts.append(title)
        elif ax.get_ylabel() and ax.get_xlabel():
            parts.append(f"{ax.get_ylabel()} against {ax.get_xlabel()}")
    return "; ".join(dict.fromkeys(parts)) or "figure"


def _describe_figures_for_alt_text() -> None:
    """Store each inline figure's :func:`figure_alt_text` as its output's ``alt`` metadata
    (docs/conf.py gives it to the site's ``<img>``; nbval does not compare metadata)."""
    from matplotlib_inline import backend_inline

    fetch = backend_inline._fetch_figure_metadata
    if getattr(fetch, "_tetrt_alt", False):
        return

    def with_alt(fig: Any) -> dict[str, Any]:
        return {**(fetch(fig) or {}), "alt": figure_alt_text(fig)}

    with_alt._tetrt_alt = True  # type: ignore[attr-defined]
    backend_inline._fetch_figure_metadata = with_alt


# --------------------------------------------------------------------------- errors


@functools.cache
def _path_prefixes() -> tuple[str, ...]:
    """Absolute folders whose prefix a reader does not need: site-packages, the stdlib,
    the checkout (so ``tetrt_support/...`` and ``torch/...`` remain)."""
    folders = set(site.getsitepackages()) | {site.getusersitepackages()}
    paths = sysconfig.get_paths()
    folders |= {paths["purelib"], paths["platlib"], paths["stdlib"], paths["platstdlib"]}
    folders.add(str(pathlib.Path(__file__).resolve().parent.parent))  # the checkout
    cleaned = {os.path.realpath(f) for f in folders if f} | {f for f in folders if f}
    return tuple(sorted((f.rstrip("/") + "/" for f in cleaned), key=len, reverse=True))


def short_paths(text: str, shell: Any = None) -> str:
    """``text`` with the kernel's cell files named as IPython names them (``Cell In[3]``)
    and absolute library and checkout paths made relative."""

    def cell_name(match: re.Match[str]) -> str:
        named = shell.compile.format_code_name(match.group(0)) if shell is not None else None
        return " ".join(named) if named else "<cell>"

    text = _CELL_FILE.sub(cell_name, text)
    for prefix in _path_prefixes():
        text = text.replace(prefix, "")
    return text


def _innermost_cell_frame(shell: Any, tb: TracebackType | None) -> tuple[str, int, str] | None:
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        named = shell.compile.format_code_name(code.co_filename)
        if named is not None:
            found = (" ".join(named), tb.tb_lineno, code.co_name, code.co_filename)
        tb = tb.tb_next
    if found is None:
        return None
    cell, lineno, function, filename = found
    where = f"{cell}, line {lineno}" + (f", in {function}" if function != "<module>" else "")
    return where, lineno, linecache.getline(filename, lineno).rstrip()


def wrap_lines(text: str, width: int = OUTPUT_WIDTH) -> list[str]:
    """``text``'s lines, each longer than ``width`` wrapped at spaces, continued under its
    own indentation plus two spaces (a word longer than a line, a URL say, is kept whole)."""
    lines = []
    for line in text.splitlines() or [""]:
        if len(line) <= width:
            lines.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        lines += textwrap.wrap(line.strip(), width, initial_indent=indent, subsequent_indent=indent + "  ",
                               break_long_words=False, break_on_hyphens=False) or [""]
    return lines


def format_short_exception(shell: Any, etype: type[BaseException], value: BaseException,
                           tb: TracebackType | None) -> list[str]:
    """The exception's type and message, after the innermost frame of the notebook's code,
    wrapped to :data:`OUTPUT_WIDTH` (the message nbval compares is the exception's, unwrapped)."""
    lines = []
    frame = _innermost_cell_frame(shell, tb)
    if frame is not None:
        where, lineno, source = frame
        lines.append(f"\x1b[36m{where}\x1b[39m")
        if source:
            arrow = f"----> {lineno} "
            code = source.strip()
            if len(arrow) + len(code) > OUTPUT_WIDTH:  # the whole line is in the cell just above
                code = code[: OUTPUT_WIDTH - len(arrow) - 1] + "\u2026"
            lines.append(f"\x1b[32m{arrow.rstrip()}\x1b[39m {code}")
        lines.append("")
    message = short_paths(str(value), shell)
    if _STACK_TRACE_REFERENCE.search(message):  # the frames it points at are not shown here
        message = _STACK_TRACE_REFERENCE.sub("", message).rstrip() + (
            "\n(library frames left out; setup(short_tracebacks=False) shows the full traceback)")
    name = etype.__name__
    text = wrap_lines(f"{name}: {message}" if message else name)
    text[0] = f"\x1b[31m{name}\x1b[39m" + text[0][len(name):]
    lines += text
    for note in getattr(value, "__notes__", ()):
        lines += wrap_lines(short_paths(str(note), shell))
    return lines


def _set_short_tracebacks(shell: Any, enabled: bool) -> None:
    if not enabled:
        shell.set_custom_exc((), None)
        return

    def handler(shell: Any, etype: type[BaseException], value: BaseException,
                tb: TracebackType | None, tb_offset: int | None = None) -> list[str]:
        stb = format_short_exception(shell, etype, value, tb)
        # The published message (what nbval compares, what a .ipynb stores) gets short
        # paths too, with cells named "<cell>": nbval runs cells without history, so an
        # "In[N]" would differ from the stored run. The exception itself is left as raised.
        shell._showtraceback(etype, short_paths(str(value)), stb)
        return stb

    shell.set_custom_exc((Exception,), handler)


def _format_warning(message: Warning | str, category: type[Warning], filename: str,
                    lineno: int, line: str | None = None) -> str:
    return f"{category.__name__}: {short_paths(str(message))}\n"
