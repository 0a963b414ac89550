"""Find the model families of the installed ``transformers`` that compute with complex numbers.

By reading their code, not from a list: a family qualifies when one of its ``modeling_*.py``
files creates or transforms complex values (``view_as_complex``, ``torch.polar``, the
``torch.fft`` functions, complex dtypes, ``stft``/``istft``). Feature extractors are left
out: they run in preprocessing, outside the model that a compiler sees.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COMPLEX_MARKERS", "MARKER_WORDS", "ComplexSource", "complex_modeling_files"]

#: dotted names whose use marks code as computing with complex numbers
COMPLEX_MARKERS: dict[str, re.Pattern[str]] = {
    "view_as_complex": re.compile(r"(^|\.)view_as_complex$"),
    "torch.polar": re.compile(r"^torch\.polar$"),
    "torch.fft": re.compile(r"^torch\.fft\.\w+$"),
    "complex dtype": re.compile(r"^torch\.(complex64|complex128|cfloat|cdouble)$"),
    "stft/istft": re.compile(r"^torch\.i?stft$"),
    "torch.complex": re.compile(r"^torch\.complex$"),
}


#: a word every name a marker matches contains, so a file whose text has none of them holds no
#: marker and is not parsed (most modeling files: parsing them all takes seconds)
MARKER_WORDS = ("complex", "polar", "fft", "stft", "cfloat", "cdouble")


@dataclass(frozen=True)
class ComplexSource:
    """One modeling file and the complex-number markers it holds, with their line numbers."""

    family: str  # the transformers model directory, e.g. "llama4"
    path: str  # relative to the transformers package
    markers: dict[str, tuple[int, ...]]


def _transformers_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("transformers is not installed")
    return Path(spec.origin).parent


def _dotted_names(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, "torch.fft.rfft")`` for every attribute chain in the code (strings, comments
    and docstrings are not code, so they never count)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        parts, cur = [], node
        while isinstance(cur, ast.Attribute):
            parts.append(cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Name):
            parts.append(cur.id)
        out.append((node.lineno, ".".join(reversed(parts))))
    return out


def complex_modeling_files() -> list[ComplexSource]:
    """Every ``models/<family>/modeling_*.py`` of the installed transformers that computes
    with complex numbers, sorted by family."""
    root = _transformers_root()
    found = []
    for path in sorted((root / "models").glob("*/modeling_*.py")):
        text = path.read_text(encoding="utf-8")
        if not any(word in text for word in MARKER_WORDS):
            continue
        hits: dict[str, list[int]] = {}
        for lineno, name in _dotted_names(ast.parse(text)):
            for marker, pattern in COMPLEX_MARKERS.items():
                if pattern.search(name):
                    hits.setdefault(marker, []).append(lineno)
        if hits:
            found.append(
                ComplexSource(path.parent.name, str(path.relative_to(root)), {k: tuple(sorted(set(v))) for k, v in hits.items()})
            )
    return found
