"""The `spartune` command."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="spartune", description="Fast pruned neural networks on NVIDIA GPUs.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="prune a weight into every pattern and run the reference ops")
    demo.add_argument("--rows", type=int, default=1024)
    demo.add_argument("--cols", type=int, default=768)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .bench.demo import run_demo

        rows = run_demo(args.rows, args.cols)
        return 0 if all(r["round_trip"] and r["linear_err"] < 1e-6 for r in rows) else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
