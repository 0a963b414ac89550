#!/usr/bin/env python3
"""Notebook machinery: regenerate stored outputs, check jupytext pairs, render HTML.

Each notebook is authored as a jupytext ``py:percent`` file (``notebooks/NN_name.py``,
reviewable as a diff) paired with the ``.ipynb`` that stores the outputs nbval replays.

    python scripts/notebooks.py regenerate [NAME ...]   # .py -> .ipynb, execute in place
    python scripts/notebooks.py check-sync               # every pair holds the same cells
    python scripts/notebooks.py html [OUTDIR]            # rendered copies for a review
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
VOLATILE_CELL_METADATA = ("execution", "collapsed", "scrolled", "jupyter")


def sources() -> list[pathlib.Path]:
    return sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def _cells(nb: nbformat.NotebookNode) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (c.cell_type, c.source.strip(), tuple(c.get("metadata", {}).get("tags", [])))
        for c in nb.cells
    ]


def strip_volatile(nb: nbformat.NotebookNode) -> None:
    """Drop what changes on every run (timestamps) and keep counts, tags and outputs."""
    for cell in nb.cells:
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    lang = nb.metadata.get("language_info", {})
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"} | {
        k: v for k, v in lang.items() if k in ("codemirror_mode", "file_extension", "mimetype", "nbconvert_exporter")
    }
    nb.metadata.pop("jupytext", None)


def regenerate(names: list[str], timeout: int) -> None:
    chosen = [p for p in sources() if not names or any(n in p.name for n in names)]
    if not chosen:
        sys.exit(f"no notebook source matches {names}")
    env_backup = dict(os.environ)
    os.environ["TQDM_DISABLE"] = "1"
    try:
        for src in chosen:
            nb = jupytext.read(src)
            strip_volatile(nb)
            print(f"executing {src.name} ...", flush=True)
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
            strip_volatile(nb)
            out = src.with_suffix(".ipynb")
            nbformat.write(nb, out)
            print(f"  wrote {out.relative_to(ROOT)}", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(env_backup)


def out_of_sync() -> list[str]:
    problems = []
    for src in sources():
        ipynb = src.with_suffix(".ipynb")
        if not ipynb.exists():
            problems.append(f"{ipynb.name}: missing (run: python scripts/notebooks.py regenerate {src.stem})")
            continue
        if _cells(jupytext.read(src)) != _cells(nbformat.read(ipynb, as_version=4)):
            problems.append(f"{ipynb.name}: cells differ from {src.name} (regenerate it)")
    for ipynb in sorted(NOTEBOOKS.glob("*.ipynb")):
        if not ipynb.with_suffix(".py").exists():
            problems.append(f"{ipynb.name}: no paired py:percent source")
    return problems


def html(outdir: pathlib.Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    for ipynb in sorted(NOTEBOOKS.glob("*.ipynb")):
        subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html",
                        "--output-dir", str(outdir), str(ipynb)], check=True)
    print(f"rendered notebooks in {outdir}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    reg = sub.add_parser("regenerate", help="execute notebooks in place from their py:percent sources")
    reg.add_argument("names", nargs="*")
    reg.add_argument("--timeout", type=int, default=1800)
    sub.add_parser("check-sync", help="fail if a .ipynb and its .py pair hold different cells")
    h = sub.add_parser("html", help="render every notebook to HTML")
    h.add_argument("outdir", nargs="?", default=str(ROOT / "html"))
    args = parser.parse_args()
    if args.cmd == "regenerate":
        regenerate(args.names, args.timeout)
    elif args.cmd == "check-sync":
        problems = out_of_sync()
        print("\n".join(problems) if problems else "all notebook pairs in sync")
        sys.exit(1 if problems else 0)
    else:
        html(pathlib.Path(args.outdir))


if __name__ == "__main__":
    main()
