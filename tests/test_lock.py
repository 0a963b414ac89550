"""The installed packages are the ones the stored notebook outputs were made with.

Strict nbval compares outputs that quote other libraries (onnxscript's ConversionError
text, transformers' class names, torch's graphs), so an upgrade can fail a notebook with
no hint why. This test names each installed package whose version differs from
requirements/lock.txt, and each dependency of the project that the lock leaves unpinned.
"""

from __future__ import annotations

import importlib.metadata as metadata
import pathlib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lock.txt"
PROJECT = "tetrt-support"
EXTRAS = ("notebooks", "docs", "test")  # what the README's two commands install
INSTALL = 'uv pip install --compile-bytecode -c requirements/lock.txt -e ".[test]"'


def locked_versions() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{LOCK.name}: {line!r} is not an exact pin (name==version)"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def installed_dependencies(name: str = PROJECT, extras: tuple[str, ...] = EXTRAS) -> set[str]:
    """Every installed distribution that ``name[extras]`` needs, transitively."""
    seen: set[str] = set()
    visited: set[tuple[str, frozenset[str]]] = set()
    todo = [(name, frozenset(extras))]
    while todo:
        dist_name, dist_extras = todo.pop()
        if (dist_name, dist_extras) in visited:
            continue
        visited.add((dist_name, dist_extras))
        try:
            requires = metadata.requires(dist_name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            envs = [{"extra": e} for e in dist_extras] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            key = canonicalize_name(req.name)
            if key == canonicalize_name(PROJECT):  # a self-reference such as [notebooks,docs]
                todo.append((PROJECT, frozenset(req.extras)))
                continue
            try:
                metadata.version(req.name)
            except metadata.PackageNotFoundError:
                continue  # e.g. a platform-only dependency
            seen.add(key)
            todo.append((req.name, frozenset(req.extras)))
    return seen


def test_installed_versions_match_the_lock() -> None:
    differing = []
    for name, pinned in sorted(locked_versions().items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # not installed here (e.g. only the notebooks extra): nothing to compare
        if Version(installed) != Version(pinned):
            differing.append(f"{name}: installed {installed}, lock {pinned}")
    assert not differing, (
        f"The stored notebook outputs were made with the versions in requirements/{LOCK.name}; "
        f"these installed packages differ, and strict nbval may fail because of them:\n  "
        + "\n  ".join(differing) + f"\nReinstall with: {INSTALL}")


def test_lock_pins_every_dependency() -> None:
    unpinned = sorted(installed_dependencies() - set(locked_versions()))
    assert not unpinned, (
        f"requirements/{LOCK.name} does not pin these dependencies of {PROJECT}[{','.join(EXTRAS)}]: "
        f"{', '.join(unpinned)} (add their installed versions)")


def test_the_readme_commands_install_the_locked_uv_and_ci_runs_the_test_command_verbatim() -> None:
    """Both set-up commands get uv from pip under the lock, then install under the lock with byte
    code compiled (uv does not compile by default; without .pyc files every process would
    compile torch again where PYTHONDONTWRITEBYTECODE is set); .ci/run runs the test command
    exactly as the README prints it."""
    import re

    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^python3 -m venv \.venv && .*$", readme, flags=re.M)
    assert len(commands) == 2, commands
    for command in commands:
        assert re.search(r"pip install (-q )?-c requirements/lock\.txt uv && "
                         r"uv pip install (-q )?--compile-bytecode -c requirements/lock\.txt -e ", command), command
    assert "uv" in locked_versions()
    (test_command,) = (c for c in commands if c.endswith("&& python -m pytest"))
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()
