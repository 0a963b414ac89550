#!/usr/bin/env python3
"""Notebook machinery: regenerate stored outputs and check the jupytext pairs.

Each notebook is a pair: ``notebooks/NN_name.py`` (jupytext ``py:percent``, the reviewable
source) and ``NN_name.ipynb`` (the stored outputs that strict nbval replays). The pairing
is jupytext's own, declared in ``notebooks/jupytext.toml``: in JupyterLab (jupytext's
contents manager is active once jupytext is installed) saving either file writes both,
and ``jupytext --sync notebooks/NN_name.ipynb`` brings an older file up to date.

    python scripts/notebooks.py regenerate [NAME ...]   # execute the .py, rewrite the pair
    python scripts/notebooks.py check-sync              # fail if a pair holds different cells

Regeneration executes each source in a fresh kernel of this environment, records the
named kernel ``tetrt`` (what JupyterLab writes when it opens the notebook with that
kernel, so opening leaves the file untouched), and strips volatile metadata with
nbstripout while keeping outputs, execution counts and tags.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys

import jupytext
import nbformat
from jupytext.compare import NotebookDifference, compare_notebooks
from jupytext.config import load_jupytext_config
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TEXT_FORMAT = "py:percent"
# What JupyterLab stores once it starts the kernel installed with
# `python -m ipykernel install --sys-prefix --name tetrt --display-name "Python 3 (tetrt)"`.
KERNELSPEC = {"display_name": "Python 3 (tetrt)", "language": "python", "name": "tetrt"}
# nbstripout with outputs and counts kept: it drops only what changes on every run
# (execution timestamps, collapsed/scrolled state, widget state) and numbers cell ids.
NBSTRIPOUT = [sys.executable, "-m", "nbstripout", "--keep-output", "--keep-count"]


def sources() -> list[pathlib.Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def _config():
    config = load_jupytext_config(str(NOTEBOOKS))
    if config is None:
        sys.exit(f"no jupytext configuration found for {NOTEBOOKS.relative_to(ROOT)}")
    return config


def difference(ipynb: pathlib.Path, src: pathlib.Path) -> str | None:
    """jupytext's own comparison of a pair's cells (source, type, metadata); None if equal."""
    try:
        compare_notebooks(nbformat.read(ipynb, as_version=4), jupytext.read(src), fmt=TEXT_FORMAT)
    except (NotebookDifference, AssertionError) as error:
        lines = [line for line in str(error).strip().splitlines() if line.strip()]
        return "\n    ".join(lines[:8]) if lines else type(error).__name__
    return None


# Colour codes in a stored output (IPython's error colours, a library's coloured message) are
# noise in the .ipynb, in a diff and on the site; a stored file holds plain text. nbval
# removes them from both sides before comparing (notebooks/nbval_sanitize.cfg).
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [ANSI.sub("", line) for line in output["traceback"]]
                output["evalue"] = ANSI.sub("", output["evalue"])
            elif output.get("output_type") == "stream":
                output["text"] = ANSI.sub("", output["text"])


def regenerate(names: list[str], timeout: int) -> None:
    chosen = [p for p in sources() if not names or any(n in p.name for n in names)]
    if not chosen:
        sys.exit(f"no notebook source matches {names}")
    config = _config()
    env_backup = dict(os.environ)
    os.environ["TQDM_DISABLE"] = "1"
    try:
        for src in chosen:
            ipynb = src.with_suffix(".ipynb")
            if ipynb.exists() and ipynb.stat().st_mtime > src.stat().st_mtime and difference(ipynb, src):
                sys.exit(f"{ipynb.relative_to(ROOT)} holds edits that {src.name} does not (saved where "
                         f"jupytext was not active?): run `jupytext --sync {ipynb.relative_to(ROOT)}` "
                         f"first to keep them, or touch {src.name} to discard them")
            nb = jupytext.read(src)
            nb.metadata["kernelspec"] = dict(KERNELSPEC)
            print(f"executing {src.name} ...", flush=True)
            # The kernel of this environment; language_info is recorded as it reports it.
            NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                           resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
            nb.metadata["kernelspec"] = dict(KERNELSPEC)
            strip_ansi(nb)
            jupytext.write(nb, ipynb)  # as jupytext's contents manager writes it in Lab
            subprocess.run([*NBSTRIPOUT, str(ipynb)], check=True)
            # The text file last, so it is the newer of the pair (jupytext takes inputs from it).
            jupytext.write(jupytext.read(ipynb), src, fmt=TEXT_FORMAT, config=config)
            print(f"  wrote {ipynb.relative_to(ROOT)} and {src.relative_to(ROOT)}", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(env_backup)


def out_of_sync() -> list[str]:
    problems = []
    for src in sources():
        ipynb = src.with_suffix(".ipynb")
        if not ipynb.exists():
            problems.append(f"{ipynb.name}: missing (run: python scripts/notebooks.py regenerate {src.stem[:2]})")
            continue
        diff = difference(ipynb, src)
        if diff:
            problems.append(
                f"{ipynb.name} and {src.name} hold different cells:\n    {diff}\n  After editing the .py: "
                f"python scripts/notebooks.py regenerate {src.stem[:2]}; after editing the .ipynb where "
                f"jupytext was not active: jupytext --sync notebooks/{ipynb.name}")
    for ipynb in sorted(NOTEBOOKS.glob("*.ipynb")):
        if not ipynb.with_suffix(".py").exists():
            problems.append(f"{ipynb.name}: no paired py:percent source (jupytext --sync notebooks/{ipynb.name})")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    reg = sub.add_parser("regenerate", help="execute notebooks from their py:percent sources, rewrite both files")
    reg.add_argument("names", nargs="*")
    reg.add_argument("--timeout", type=int, default=1800)
    sub.add_parser("check-sync", help="fail if a .ipynb and its .py pair hold different cells")
    args = parser.parse_args()
    if args.cmd == "regenerate":
        regenerate(args.names, args.timeout)
    else:
        problems = out_of_sync()
        print("\n".join(problems) if problems else "all notebook pairs in sync")
        sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
