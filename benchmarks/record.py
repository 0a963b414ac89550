"""What every results file records: the machine, the run's kind, failures; and where it goes.

A full run writes ``benchmarks/results/<name>.json`` (committed; the notebooks read it).
A ``--quick`` smoke run writes ``benchmarks/results/smoke/<name>.json``, which git
ignores, and marks the file ``"smoke_run": true`` so that no reader mistakes it for a
measurement.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

from tetrt_support.report.results import RESULTS_DIR

SMOKE_DIR = RESULTS_DIR / "smoke"


def private_inductor_cache(prefix: str) -> str:
    """``TORCHINDUCTOR_CACHE_DIR`` as the caller set it, else a fresh directory named
    ``prefix...`` that is removed when the process exits (timings then start from an empty
    cache). Call it before torch is imported."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        path = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, path, True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def results_path(name: str, *, smoke: bool, out_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Where the results file ``name`` (without ``.json``) of this run goes."""
    return (out_dir or (SMOKE_DIR if smoke else RESULTS_DIR)) / f"{name}.json"


def machine(device: str = "cpu") -> dict[str, Any]:
    """The host, the versions and (on CUDA) the GPU a run measured on."""
    import torch

    info: dict[str, Any] = {
        "when_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "device": device,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    info["cuda"] = torch.cuda.is_available()
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, cuda_runtime=torch.version.cuda)
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            pass
    return info


def torchao_version() -> dict[str, Any]:
    """``{"torchao": version}`` where torchao is installed (the suites that time its float8 training), else ``{}``."""
    try:
        import torchao
    except ImportError:
        return {}
    return {"torchao": torchao.__version__}


def error_record(e: BaseException) -> dict[str, str]:
    """A failure as a results entry: the exception type and the first line of its message."""
    first = str(e).splitlines()[0][:300] if str(e) else ""
    return {"error": f"{type(e).__name__}: {first}"}


_REPO = pathlib.Path(__file__).resolve().parent.parent
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def package_frames(e: BaseException) -> list[str]:
    """The frames of this repository a failure passed through, outermost first, as
    ``path:line in function`` relative to the repository (no machine path): the traceback's
    and those Dynamo names in its message ("from user code")."""
    frames = []
    for path, line, function in _FRAME.findall("".join(traceback.format_exception(e))):
        resolved = pathlib.Path(path).resolve()
        if resolved.is_file() and resolved.is_relative_to(_REPO) and ".venv" not in resolved.parts:
            frames.append(f"{resolved.relative_to(_REPO).as_posix()}:{line} in {function}")
    return list(dict.fromkeys(frames))


def alternating_orders(names: Sequence[Any], rounds: int) -> Iterator[tuple[Any, ...]]:
    """``rounds`` orders of ``names``, reversed every other round, so that no setting always
    runs first (on a cold cache or a machine whose load drifts)."""
    for i in range(rounds):
        yield tuple(names) if i % 2 == 0 else tuple(reversed(names))


def write(path: pathlib.Path, result: dict[str, Any], *, indent: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent) + "\n")
