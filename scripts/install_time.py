"""Time the README's test set-up from nothing: a new virtual environment and an empty
package cache, installed by uv (the README's command) and by plain pip, then compare what
each installed.

    python scripts/install_time.py            # writes benchmarks/results/install_time.json
    python scripts/install_time.py --rounds 2

Each round installs with both, alternating which goes first. Wheels are downloaded, as on
a fresh CI machine; the file records the machine, the commands and each install's seconds.
A script, not a test: nothing here asserts, but a round whose two environments hold
different packages is recorded as such.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "install_time.json"
# The README's test command, up to (not including) ``python -m pytest``.
_README_INSTALL = re.compile(r"^(python3 -m venv \.venv && \. \.venv/bin/activate && .*?) && python -m pytest$", re.M)


def readme_install_command() -> str:
    """The install part of the README's test command, as the README spells it."""
    match = _README_INSTALL.search((ROOT / "README.md").read_text())
    if match is None:
        raise SystemExit("install_time: README.md has no test command ending in '&& python -m pytest'")
    return match.group(1)


def pip_only(command: str) -> str:
    """The same install with pip alone (no uv): pip compiles byte code by default."""
    plain = re.sub(r"pip install -q -c requirements/lock\.txt uv && uv pip install -q --compile-bytecode ",
                   "pip install -q ", command)
    if plain == command:
        raise SystemExit(f"install_time: cannot derive the pip-only command from {command!r}")
    return plain


def _install(command: str, workdir: pathlib.Path) -> dict[str, Any]:
    env = dict(os.environ, PIP_NO_CACHE_DIR="1", UV_CACHE_DIR=str(workdir / "uv-cache"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("VIRTUAL_ENV", None)
    # Run from the repository (the editable install needs it), the venv moved out of it.
    venv = workdir / "venv"
    text = command.replace(".venv", str(venv))
    start = time.perf_counter()
    done = subprocess.run(["bash", "-c", text], cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        return {"seconds": round(seconds, 1), "error": done.stderr.strip().splitlines()[-1:]}
    freeze = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"],
                            capture_output=True, text=True, check=True).stdout.split()
    packages = sorted(p for p in freeze if not p.lower().startswith("uv=="))
    pyc = sum(1 for _ in venv.rglob("*.pyc"))
    return {"seconds": round(seconds, 1), "packages": len(packages), "pyc_files": pyc, "_freeze": packages}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    uv_command = readme_install_command()
    commands = {"uv (README)": uv_command, "pip": pip_only(uv_command)}
    rounds = []
    for i, order in enumerate(record.alternating_orders(list(commands), args.rounds)):
        row: dict[str, Any] = {}
        for name in order:
            with tempfile.TemporaryDirectory(prefix="tetrt-install-") as workdir:
                row[name] = _install(commands[name], pathlib.Path(workdir))
                print(f"round {i + 1}: {name}: {row[name]['seconds']} s", flush=True)
        freezes = [r.pop("_freeze", None) for r in row.values()]
        row["same_packages"] = None if None in freezes else freezes[0] == freezes[1]
        row["order"] = list(order)
        rounds.append(row)
    result = {
        "benchmark": "install_time",
        "machine": record.machine("cpu"),
        "protocol": "each install from a new virtual environment and an empty cache (PIP_NO_CACHE_DIR=1, "
                    "a fresh UV_CACHE_DIR), downloading every wheel; wall seconds of the command",
        "commands": commands,
        "rounds": rounds,
    }
    record.write(OUT, result)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
