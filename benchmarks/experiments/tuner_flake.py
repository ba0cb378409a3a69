"""(session 36: after the bind fix, the first candidate timed still measured 223-284 us where the
rest ran 22-36: this prints which it is.) The tuner's timings of 64:2:8 7B down N = 16 (fresh weight each trial), with what
time_callable saw inside: do_bench's eager time, the cold replay, the bound's single calls."""
import sys

import torch
import triton.testing

import spartune as st
from spartune.prune import sparsify_weight
from spartune.tune import measure

log = []
_do_bench, _cold, _tc = triton.testing.do_bench, measure.cold_replay, measure.time_callable


def do_bench(fn, **kw):
    t = _do_bench(fn, **kw)
    log.append(f"do_bench {t * 1e3:.1f}")
    return t


def cold(fn, *a, **kw):
    t = _cold(fn, *a, **kw)
    log.append(f"replay {t * 1e6:.1f}")
    return t


def tc(fn, **kw):
    t = _tc(fn, **kw)
    log.append(f"-> {t * 1e6:.1f} (bound {kw.get('bound')})")
    print("  " + " | ".join(log), flush=True)
    log.clear()
    return t


triton.testing.do_bench, measure.cold_replay, measure.time_callable = do_bench, cold, tc
from spartune.tune import tuner as T  # noqa: E402

_measure = T.Tuner._measure


def measure_named(self, c, cfg, predicted, bound=None):
    print(f" {c.backend} {c.config} predicted {predicted * 1e6:.1f} us", flush=True)
    return _measure(self, c, cfg, predicted, bound)


T.Tuner._measure = measure_named
M, Kd, N = 4096, 11008, 16
for trial in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    print(f"trial {trial}", flush=True)
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "64:2:8")
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
    st.linear(x, A)
    torch.cuda.synchronize()
