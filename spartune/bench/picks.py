"""What the tuner picked, as a report shows it: the Choice of a problem and its one-line label."""
from __future__ import annotations

from dataclasses import asdict, is_dataclass

_ABBREV = {"num_warps": "w", "num_stages": "st", "block_m": "bm", "block_n": "bn", "block_k": "bk", "group": "g",
           "group_m": "g", "split_k": "sk"}


def label(backend: str, config) -> str:
    """'blocked bn=128 w=4 ...': the backend, then the config's fields (true flags by name)."""
    cfg = asdict(config) if is_dataclass(config) else None
    parts = []
    for k, v in (cfg or {}).items():
        if isinstance(v, bool):
            if v:
                parts.append(k)
        else:
            parts.append(f"{_ABBREV.get(k, k)}={v}")
    return backend + (f" {' '.join(parts)}" if parts else "")


def choice_dict(choice) -> dict | None:
    if choice is None:
        return None
    cfg = asdict(choice.config) if is_dataclass(choice.config) else None
    return {"backend": choice.backend, "config": cfg, "label": label(choice.backend, choice.config),
            "tuner_seconds": choice.measured}
