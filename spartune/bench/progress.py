"""How a run reports as it goes: a progress bar (or printed counter) and one-line errors for the
document's notes."""
from __future__ import annotations

import sys


class Progress:
    """tqdm when it is installed, else a printed counter. `step(msg)` after each problem."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.total, self.done, self.enabled, self.bar = total, 0, enabled, None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="problem", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def step(self, msg: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {msg}", flush=True)

    def note(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        elif self.enabled:
            print(msg, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def short(e: BaseException, limit: int = 160) -> str:
    """'Type: first line of the message', cut to `limit` characters (a table cell, a note)."""
    text = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return text[:limit]
