"""The `spartune` command.

    spartune bench [--suite NAME] [--quick] [--shape M,K,N]... [--pattern P]... [--density D]...
                   [--out DIR] [--dtype float16] [--mode fast] [--budget-s S] [--list]
    spartune tune  (--shape M,K,N... | --shapes-file FILE | --suite NAME) [--pattern P]... [--density D]...
                   [--compile-all]
    spartune info  [--json]
    spartune db export PATH | spartune db import PATH [--overwrite]
    spartune demo  [--rows R] [--cols C]
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from .bench import suites
from .tune.problem import MEMORY_POLICIES
from .versions import __version__

NO_REEXEC_ENV = "SPARTUNE_NO_REEXEC"
E2E_DESCRIPTION = ("whole models, dense and sparse, eager and torch.compile: BERT-base, a Llama-7B decoder layer "
                   "(prefill, decode under CUDA graphs), MobileNetV1 (--filter picks models; --quick: block:64 at 90%)")


# --- argument types (argparse turns their ArgumentTypeError into a usage error, exit 2) ---------------

def _shape(text: str):
    try:
        return suites.parse_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _pattern(text: str) -> str:
    try:
        return suites.normalize_pattern(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _density(text: str) -> float:
    try:
        return suites.parse_density(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value

    return parse


def _problem_args(p: argparse.ArgumentParser, *, suite_help: str, extra_suites=()) -> None:
    p.add_argument("--suite", choices=sorted([*suites.SUITES, *extra_suites]), help=suite_help)
    p.add_argument("--shape", type=_shape, action="append", metavar="M,K,N",
                   help="a weight M x K applied to N tokens (repeatable); replaces the suite's shapes")
    p.add_argument("--pattern", type=_pattern, action="append", metavar="P",
                   help="sparsity pattern (repeatable): csr, block:64, block:32x64, shfl:64, 2:4, 64:2:8 "
                        f"(default: the suite's, usually {', '.join(suites.DEFAULT_PATTERNS)})")
    p.add_argument("--density", type=_density, action="append", metavar="D",
                   help="fraction of entries kept, in (0, 1] (repeatable; default: the suite's, usually "
                        f"{', '.join(map(str, suites.DEFAULT_DENSITIES))}); N:M patterns use their own")
    p.add_argument("--filter", action="append", metavar="TEXT", help="only problems whose name contains TEXT (repeatable)")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument("--mode", choices=("fast", "model", "exhaustive"),
                   help="tuner mode (default: $SPARTUNE_MODE or fast)")
    p.add_argument("--memory", choices=MEMORY_POLICIES,
                   help="weight-memory policy: 'lean' keeps no dense copy, library conversion or V:N:M 2:4 copy "
                        "of a sparse weight (dense, where it wins, decompresses per call) "
                        "(default: $SPARTUNE_MEMORY or speed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar or counter")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spartune", description="Fast pruned neural networks on NVIDIA GPUs.")
    parser.add_argument("--version", action="version", version=f"spartune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    acc = sub.add_parser("accuracy", help="all-MiniLM-L6-v2 pruned into every pattern at 50/75/90%%: weight kept, "
                                          "layer output error, embedding cosine (CPU; needs spartune[real])")
    acc.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    acc.add_argument("--finetune", type=int, default=0, metavar="STEPS",
                     help="also distill each pruned model toward the dense embeddings for STEPS Adam steps "
                          "(other sentences) and report the cosine after (about 0.5 s a step on 2 CPU cores)")

    demo = sub.add_parser("demo", help="prune a weight into every pattern and run the reference ops")
    demo.add_argument("--rows", type=_positive(int), default=1024, help="the weight's rows (default: 1024)")
    demo.add_argument("--cols", type=_positive(int), default=768, help="the weight's columns (default: 768)")

    suite_lines = "\n".join(f"  {name:<10} {s.description}" for name, s in suites.SUITES.items()) + \
        f"\n  {'e2e':<10} {E2E_DESCRIPTION}"
    bench = sub.add_parser(
        "bench", help="time spartune against cuBLAS, cuSPARSE, torch BSR and cuSPARSELt; table, JSON, plot",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs a suite side by side with the libraries users would call otherwise and writes "
                    "DIR/bench-SUITE.{txt,json,png}. Without a CUDA GPU: a correctness-only pass under the "
                    "Triton interpreter on scaled-down shapes (DIR/bench-SUITE-cpu.{txt,json}).",
        epilog=f"suites:\n{suite_lines}")
    _problem_args(bench, suite_help="the problems to run (default: quick)", extra_suites=("e2e",))
    bench.add_argument("--quick", action="store_true",
                       help="a few problems, under a minute on a GPU (with --suite: 4 of that suite's problems)")
    bench.add_argument("--out", default="spartune-bench", metavar="DIR", help="where results go (default: %(default)s)")
    bench.add_argument("--op", choices=("linear", "spmm"), default="linear",
                       help="ours as spartune.linear(x (N, K), A) or spartune.spmm(A, X (K, N)) (default: linear)")
    bench.add_argument("--budget-s", type=_positive(float), metavar="S",
                       help="start no new problem after S seconds (results so far are kept)")
    bench.add_argument("--max-problems", type=_positive(int), metavar="N",
                       help="at most N problems, spread over the list (CPU pass default: 12)")
    bench.add_argument("--skip", action="append", default=[], metavar="IMPL",
                       choices=("cusparse_csr", "cusparse_bsr", "torch_bsr", "cusparselt"),
                       help="leave out a baseline (repeatable)")
    bench.add_argument("--no-rotate", action="store_true", help="time on one input set even when it fits in L2")
    bench.add_argument("--list", action="store_true", help="print the problems and exit")

    tune = sub.add_parser("tune", help="pre-tune shapes into the tuning DB (GPU)",
                          description="Tunes spartune.linear for each problem (a random weight of the pattern, or the "
                                      "suite's real weights) and stores the choice in the tuning DB.")
    _problem_args(tune, suite_help="tune a suite's problems")
    tune.add_argument("--shapes-file", type=Path, metavar="FILE",
                      help="shapes, one a line: 'M,K,N' or 'NAME M,K,N' ('#' comments)")
    tune.add_argument("--compile-all", action="store_true",
                      help="also compile every config of the CUDA kernels for each problem, in parallel (once "
                           "per machine: later shapes of the same patterns, token counts and dtypes then tune "
                           "without compiling)")

    info = sub.add_parser("info", help="device, versions, calibration and tuning DB contents")
    info.add_argument("--json", action="store_true", help="as JSON")

    db = sub.add_parser("db", help="export, import or clear the tuning DB")
    dbsub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    exp = dbsub.add_parser("export", help="write every stored measurement and choice to a JSON file")
    exp.add_argument("path", type=Path)
    imp = dbsub.add_parser("import", help="merge a JSON file written by `spartune db export`")
    imp.add_argument("path", type=Path)
    imp.add_argument("--overwrite", action="store_true", help="imported choices replace local ones")
    clear = dbsub.add_parser("clear", help="delete the stored measurements and choices (tuned again at next use)")
    clear.add_argument("--stale", action="store_true",
                       help="only those made under other spartune / torch / triton / CUDA versions (never read again)")
    clear.add_argument("--calibration", action="store_true", help="the device calibrations too")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "accuracy":
        return _accuracy(args)
    if args.command == "demo":
        from .bench.demo import run_demo

        rows = run_demo(args.rows, args.cols)
        return 0 if all(r["round_trip"] and r["linear_err"] < 1e-6 for r in rows) else 1
    if getattr(args, "memory", None):
        from . import dispatch

        dispatch.set_memory_policy(args.memory)
    if args.command == "bench":
        return _bench(parser, args, argv)
    if args.command == "tune":
        return _tune(parser, args)
    if args.command == "info":
        return _info(args)
    if args.command == "db":
        return _db(args)
    return 2  # pragma: no cover - argparse requires a command


def _accuracy(args) -> int:
    from .bench import accuracy

    try:
        rows = accuracy.run(args.finetune, progress=lambda r: print(
            f"{r['sparsity']:.0%} {r['pattern']}: cosine {r['embedding_cosine']:.3f}"
            + (f" -> {r['cosine_finetuned']:.3f}" if "cosine_finetuned" in r else ""), file=sys.stderr, flush=True))
    except RuntimeError as e:  # the weights or the tokenizer are not installed
        print(f"spartune accuracy: {e}", file=sys.stderr)
        return 2
    print(accuracy.table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


# --- bench ---------------------------------------------------------------------------------------------

def _select(parser, args, *, quick: bool = False, shapes_file=None):
    """The problems the arguments ask for; (suite name, specs). Usage errors exit 2."""
    shapes = None
    if args.shape:
        shapes = suites.custom_shapes(args.shape)
    if shapes_file is not None:
        try:
            shapes = (shapes or []) + suites.read_shapes_file(shapes_file)
        except (OSError, ValueError) as e:
            parser.error(f"--shapes-file: {e}")
    name = args.suite
    if name is None:
        name = None if shapes else "quick"
    specs = suites.problems(name, shapes=shapes, patterns=args.pattern, densities=args.density, filters=args.filter)
    if quick and name != "quick":
        specs = suites.spread(specs, 4)
    if not specs:
        parser.error("no problem matches the arguments (check --filter)")
    return name, specs


def _bench(parser, args, argv) -> int:
    if args.suite == "e2e":
        return _bench_e2e(parser, args)
    try:
        suite, specs = _select(parser, args, quick=args.quick)
    except suites.SuiteUnavailable as e:
        print(f"spartune bench: suite skipped: {e}")
        return 0
    if args.max_problems and _cuda():  # (the CPU pass spreads its scaled-down list itself)
        specs = suites.spread(specs, args.max_problems)
    if args.list:
        for s in specs:
            print(f"{s.name:<28} {s.M:>6} {s.K:>6} {s.N:>6}  {s.pattern:<12} {s.density:g}")
        print(f"{len(specs)} problems")
        return 0
    from .bench import report, runner

    if not _cuda():
        code = _rerun_with_interpreter(argv)
        if code is not None:
            return code
        print("No CUDA device: nothing can be timed here. Running a correctness-only pass under the Triton "
              "interpreter on scaled-down shapes (spartune.linear and our kernels against spartune.reference).",
              flush=True)
    out = _out_dir(parser, args)
    options = runner.Options(dtype=args.dtype, op=args.op, mode=args.mode, budget_s=args.budget_s, seed=args.seed,
                             max_problems=args.max_problems, rotate=not args.no_rotate,
                             baselines=tuple(b for b in runner.IMPLS[1:] if b not in args.skip),
                             suite=suite or "", progress=not args.no_progress,
                             extra={"filters": args.filter, "quick": args.quick})
    stem = f"bench-{suite or 'custom'}" + ("" if _cuda() else "-cpu")
    json_path = out / f"{stem}.json"

    def checkpoint(doc):  # a run cut short still leaves its results
        report.write_json(doc, json_path)

    doc = runner.run(specs, options, checkpoint)
    paths = report.write_all(doc, out, stem)
    print()
    print(report.format_table(doc))
    print()
    for what in ("table", "json", "plot"):
        if paths.get(what):
            print(f"{what:<5} {paths[what]}")
    return 0 if doc["rows"] and all(r.get("ok") or (doc["kind"] == "correctness" and not r.get("failed"))
                                    for r in doc["rows"]) else 1


def _bench_e2e(parser, args) -> int:
    import torch

    from .bench import e2e

    workloads = [w for w in e2e.WORKLOADS if not args.filter or any(f.lower() in w.name.lower() for f in args.filter)]
    if not workloads:
        parser.error(f"no e2e model matches --filter; models: {', '.join(w.name for w in e2e.WORKLOADS)}")
    if args.shape:
        parser.error("--shape does not apply to the e2e suite (its shapes are the models')")
    if args.dtype == "float32":
        parser.error("the e2e suite runs in float16 or bfloat16")
    ignored = [flag for flag, given in (("--op", args.op != "linear"), ("--skip", args.skip),
                                         ("--max-problems", args.max_problems)) if given]
    if ignored:
        parser.error(f"{', '.join(ignored)} does not apply to the e2e suite (whole models against their dense twins)")
    pts = e2e.points(args.pattern, [1 - d for d in args.density] if args.density else None, quick=args.quick)
    if args.list:
        for w in workloads:
            for pattern, sparsity in [("dense", 0.0), *pts]:
                print(f"{w.name:<28} {pattern:<12} {'' if pattern == 'dense' else f'{sparsity:.0%}'}")
        print(f"{len(workloads) * (len(pts) + 1)} runs (eager, compiled and, for decode, CUDA graphs each)")
        return 0
    out = _out_dir(parser, args)
    cuda = _cuda()
    if not cuda:
        print("No CUDA device: running tiny versions of the models on the CPU, eager only (nothing is timed "
              "that means anything).", flush=True)
    if args.mode:
        from . import dispatch

        dispatch.set_mode(args.mode)
    json_path = out / "bench-e2e.json"

    def checkpoint(doc):
        json_path.write_text(json.dumps(doc, indent=1))

    dtype = getattr(torch, args.dtype) if cuda else torch.float32  # the CPU's half matmuls are not the GPU's
    doc = e2e.run(workloads, pts, dtype=dtype, device="cuda" if cuda else "cpu", compile=cuda,
                  tiny=not cuda, budget_s=args.budget_s, checkpoint=checkpoint)
    checkpoint(doc)
    text = e2e.table(doc)
    (out / "bench-e2e.txt").write_text(text + "\n")
    print()
    print(text)
    try:
        e2e.plot(doc, out / "bench-e2e.png")
        print(f"plot  {out / 'bench-e2e.png'}")
    except ImportError:
        print("matplotlib is not installed (pip install 'spartune[bench]'): no plot")
    print(f"json  {json_path}")
    return 0 if doc["rows"] and not any("error" in r for r in doc["rows"]) else 1


def _out_dir(parser, args) -> Path:
    """--out, made before anything runs (a run that cannot write its results should not start)."""
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"--out {out}: cannot make the directory ({e.strerror or e})")
    return out


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _rerun_with_interpreter(argv):
    """Our kernels are built for the interpreter only if TRITON_INTERPRET was set before they
    were imported (importing spartune imports them). From the command line, run again with it
    set; None when this process can go on as it is."""
    from .bench.environment import interpreter_active

    if interpreter_active() or argv is not None or os.environ.get(NO_REEXEC_ENV):
        return None
    env = dict(os.environ, TRITON_INTERPRET="1", **{NO_REEXEC_ENV: "1"})
    return subprocess.call([sys.executable, "-m", "spartune.cli", *sys.argv[1:]], env=env)


# --- tune -----------------------------------------------------------------------------------------------

def _tune(parser, args) -> int:
    if not (args.shape or args.shapes_file or args.suite):
        parser.error("tune needs problems: --shape M,K,N, --shapes-file FILE or --suite NAME")
    try:
        _, specs = _select(parser, args, shapes_file=args.shapes_file)
    except suites.SuiteUnavailable as e:
        print(f"spartune tune: suite skipped: {e}")
        return 0
    if not _cuda():
        print("spartune tune needs a CUDA GPU: tuning measures the kernels on the device (no CUDA device found). "
              "On the GPU machine: spartune tune ...; or import a tuned table: spartune db import FILE",
              file=sys.stderr)
        return 1
    from .bench import pretune
    from .bench.document import Options
    from .tune.db import default_path

    print(f"tuning {len(specs)} problems into {default_path()}", flush=True)
    rows = pretune.tune(specs, Options(dtype=args.dtype, mode=args.mode, seed=args.seed,
                                       progress=not args.no_progress), compile_all=args.compile_all)
    failed = [r for r in rows if r.get("error")]
    print(f"tuned {len(rows) - len(failed)} of {len(rows)} problems" + (f"; {len(failed)} failed" if failed else ""))
    return 1 if failed else 0


# --- info ------------------------------------------------------------------------------------------------

def db_summary(path: Path) -> dict:
    """Counts of a tuning DB, read-only (no file is created)."""
    from .tune.problem import KEY_FIELDS

    out = {"path": str(path), "exists": path.exists()}
    if not out["exists"]:
        return out
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not {"best", "results", "calibration"} <= tables:
                out["error"] = "not a spartune tuning DB (it is rebuilt on next use)"
                return out
            out["results"] = conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
            out["failed_results"] = conn.execute("SELECT COUNT(*) FROM results WHERE seconds IS NULL").fetchone()[0]
            by_op, by_device, by_backend = {}, {}, {}
            for key, backend in conn.execute("SELECT problem, backend FROM best"):
                try:
                    prob = json.loads(key)[0]
                    op, device = prob[KEY_FIELDS.index("op")], str(prob[KEY_FIELDS.index("device")])
                except (ValueError, IndexError, TypeError):
                    op, device = "?", "?"
                by_op[op] = by_op.get(op, 0) + 1
                by_device[device] = by_device.get(device, 0) + 1
                by_backend[backend] = by_backend.get(backend, 0) + 1
            out.update(best=sum(by_op.values()), best_by_op=by_op, best_by_device=by_device, best_by_backend=by_backend)
            cal = []
            for device, spec, created in conn.execute("SELECT device, spec, created FROM calibration"):
                try:
                    s = json.loads(spec)
                except ValueError:
                    s = {}
                cal.append({"device": device, "created": created, **{k: s.get(k) for k in
                            ("mma_fp16", "mma_bf16", "mma_tf32", "fma", "dram_bw", "l2_bw", "launch_s", "sms")}})
            out["calibration"] = cal
        finally:
            conn.close()
    except sqlite3.Error as e:
        out["error"] = f"cannot read it ({e}); it is rebuilt on next use"
    return out


def _setting_shown(read) -> str:
    try:
        return read()
    except ValueError as e:  # a bad $SPARTUNE_MEMORY or $SPARTUNE_MODE: info shows why instead of failing
        return f"invalid: {e}"


def _info(args) -> int:
    import datetime

    from .bench.environment import device_info, versions
    from .tune.db import default_path

    from . import dispatch

    info = {"device": device_info(), "versions": versions(), "tuner_mode": _setting_shown(dispatch.tuning_mode),
            "memory_policy": _setting_shown(dispatch.memory_policy), "cache_dir_env": os.environ.get("SPARTUNE_CACHE_DIR"), "db": db_summary(default_path())}
    if info["device"]["cuda"]:
        from .tune.device import device_name

        info["device"]["key"] = device_name()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    d, v, db = info["device"], info["versions"], info["db"]
    if d["cuda"]:
        dev = f"{d['name']} ({d['capability']}, {d['sms']} SMs, {d['memory_gib']} GiB, L2 {d['l2_mib']} MiB)"
    else:
        dev = f"{d['name']}: `spartune bench` runs a correctness-only pass under the Triton interpreter"
    print(f"spartune {v['spartune']} (kernels {v['kernels']}: tuned choices are kept per kernel build)")
    print(f"device       {dev}")
    print(f"versions     python {v['python']}, torch {v['torch']} (CUDA {v['cuda']}), triton {v['triton']}, "
          f"numpy {v['numpy']}, matplotlib {v['matplotlib']}")
    print(f"tuner        mode {info['tuner_mode']} ($SPARTUNE_MODE), memory {info['memory_policy']} ($SPARTUNE_MEMORY)")
    print(f"tuning DB    {db['path']}" + ("" if info["cache_dir_env"] else " ($SPARTUNE_CACHE_DIR moves it)"))
    if not db["exists"]:
        print("             empty: nothing tuned yet (the first call of each problem tunes it)")
    elif db.get("error"):
        print(f"             {db['error']}")
    else:
        ops_ = ", ".join(f"{k} {n}" for k, n in sorted(db["best_by_op"].items())) or "none"
        backends = ", ".join(f"{k} {n}" for k, n in sorted(db["best_by_backend"].items(), key=lambda kv: -kv[1]))
        print(f"             {db['best']} tuned problems ({ops_}); {db['results']} measurements "
              f"({db['failed_results']} failed or wrong)")
        if backends:
            print(f"             picked: {backends}")
        for device, n in sorted(db["best_by_device"].items()):
            print(f"             {n} on {device}")
    cal = db.get("calibration") or []
    if not cal:
        print("calibration  none stored" + (" (measured at the first tuned call)" if d["cuda"] else ""))
    for c in cal:
        when = datetime.datetime.fromtimestamp(c["created"]).strftime("%Y-%m-%d") if c.get("created") else "?"
        here = "  <- this device" if d.get("key") == c["device"] else ""
        print(f"calibration  {c['device']} ({when}): fp16 {_rate(c.get('mma_fp16'), 1e12)} TFLOP/s, "
              f"FMA {_rate(c.get('fma'), 1e12)} TFLOP/s, DRAM {_rate(c.get('dram_bw'), 1e12, 2)} TB/s, "
              f"L2 {_rate(c.get('l2_bw'), 1e12, 1)} TB/s{here}")
    return 0


def _rate(x, unit, digits=0):
    return "?" if not x else f"{x / unit:.{digits}f}"


# --- db ------------------------------------------------------------------------------------------------------

def _db(args) -> int:
    from .tune.db import TuningDB

    if args.db_command == "export" and not Path(args.path).parent.is_dir():  # (else: the temporary file's name)
        print(f"spartune db export: {Path(args.path).parent}: no such directory", file=sys.stderr)
        return 1
    try:
        with TuningDB() as db:
            if args.db_command == "clear":
                deleted = db.clear(stale_only=args.stale, calibration=args.calibration)
                print(f"cleared {deleted} rows from {db.path}" + (" (other versions' only)" if args.stale else ""))
            elif args.db_command == "export":
                db.export_json(args.path)
                data = json.loads(Path(args.path).read_text())
                print(f"exported {len(data['best'])} tuned problems, {len(data['results'])} measurements and "
                      f"{len(data['calibration'])} calibrations from {db.path} to {args.path}")
            else:
                added = db.import_json(args.path, overwrite=args.overwrite)
                print(f"imported {args.path} into {db.path}: {added} rows added or replaced")
    except FileNotFoundError as e:
        print(f"spartune db {args.db_command}: {e.filename or e}: no such file", file=sys.stderr)
        return 1
    except (ValueError, KeyError, OSError, RuntimeError) as e:  # a bad file: its reason, not a traceback
        print(f"spartune db {args.db_command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
