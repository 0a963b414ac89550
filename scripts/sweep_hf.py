"""Sweep every Hugging Face family that computes with complex numbers through the compiler.

    python scripts/sweep_hf.py                              # eager + onnxruntime, both strategies
    python scripts/sweep_hf.py --engines onnxruntime --families fnet wavtokenizer
    python scripts/sweep_hf.py --engines eager onnxruntime inductor

Finds the families by reading the installed transformers (tetrt_support.zoo.discover),
builds each tiny from tetrt_support.zoo.hf, exports it static and with dynamic
batch/sequence, compiles it on each engine with both lowering strategies, calls it by
keyword and compares with eager. Writes benchmarks/results/hf_sweep.json (every row, the
versions, the command) and prints the table. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.record import private_inductor_cache  # noqa: E402

private_inductor_cache("tetrt-sweep-inductor-")  # before torch loads

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tetrt_support.zoo.sweep import run_case, sweep_cases  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "hf_sweep.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["eager", "onnxruntime"])
    parser.add_argument("--strategies", nargs="+", default=["rewrite", "retrace"])
    parser.add_argument("--families", nargs="+", default=None)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.WARNING)  # the ONNX exporter's per-op notices are not results
    torch.manual_seed(0)
    cases = sweep_cases(tuple(args.engines), tuple(args.strategies), tuple(args.families) if args.families else None)
    rows = []
    for case in tqdm(cases, desc="hf sweep", unit="case"):
        rows.append(run_case(case).as_dict())
    import transformers
    import onnxruntime

    record = {
        "benchmark": "hf_sweep",
        "command": " ".join(["python scripts/sweep_hf.py", *(argv if argv is not None else sys.argv[1:])]),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "onnxruntime": onnxruntime.__version__, "python": platform.python_version()},
        "tolerance": 1e-4,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for r in rows:
        status = "PASS" if r["passed"] else "fail"
        print(f"{r['family']:16s} {'dyn' if r['dynamic'] else 'static':6s} {r['engine']:12s} {r['strategy']:8s} "
              f"cplx={r['complex_nodes']} eng={r['engine_blocks']} fb={r['fallback_blocks']} err={r['max_rel_error']} other={r['other_size_rel_error']} {status} {r['error']}")
    print(f"{sum(r['passed'] for r in rows)}/{len(rows)} cases pass; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
