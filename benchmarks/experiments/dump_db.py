"""Print the tuning DB's measured rows (fastest first): what the tuner saw for each problem."""
from spartune.tune.db import TuningDB, default_path

rows = TuningDB(default_path()).results()
for r in sorted(rows, key=lambda r: (r.get("seconds") is None, r.get("seconds") or 0))[:12]:
    cfg = (r.get("config") or {}).get("fields", {})
    short = {k: cfg[k] for k in ("bm", "bn", "num_warps", "warps_k", "stages", "x_whole") if k in cfg}
    print(r.get("backend"), None if r.get("seconds") is None else round(r["seconds"] * 1e6, 1),
          round(r["predicted"] * 1e6, 1), short, (r.get("error") or "")[:200])
