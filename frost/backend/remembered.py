"""JSON tables remembered across processes in Frost's cache directory (cuDNN's tuned plans, our kernel choices)."""
from __future__ import annotations

import json
import os
from pathlib import Path


def cache_root() -> Path:
    """$FROST_CACHE_DIR, else ~/.cache/frost."""
    return Path(os.environ.get("FROST_CACHE_DIR", Path.home() / ".cache" / "frost"))


class RememberedTable:
    """A dict read from `name` in the cache directory on first use and written back atomically by `save`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._table: dict | None = None

    @property
    def path(self) -> Path:
        return cache_root() / self.name

    def load(self) -> dict:
        if self._table is None:
            try:
                self._table = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self._table = {}
        return self._table

    def save(self) -> None:
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(self.load(), indent=0, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache directory only costs the timing again next time

    def forget(self) -> None:
        """Drop the in-memory table: the next load reads the file again."""
        self._table = None
