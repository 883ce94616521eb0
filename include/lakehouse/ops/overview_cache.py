"""The pipelines page's numbers, computed off the request path: one cache per process, kept fresh by
one background thread.

A page load must not wait for Kafka (10-15 s timeouts when it does not answer), the catalog or the
ops timeline, and must not hold a thread of the API server's shared pool while it would: that pool
also serves the Execution API, which running tasks send their heartbeats to. So requests only read
this cache (`cards()`), and a daemon thread, started by the first read, does the work in bounded
steps (`step()`):

- every RESCAN_S it reads the pipelines folder again (`lakehouse.core.spec.load_specs`): new spec files
  appear as "loading", removed ones go, a file that does not load is a broken card (its error as a
  category and an id, `history.public_error`);
- otherwise it refreshes one pipeline, the one waiting longest (never read first, then the oldest),
  once its card is REFRESH_S old: `history.overview` (bounded by the timeouts of the reads it makes)
  reduced to what a browser may receive (`history.public`). A pipeline whose overview fails keeps an
  error card (category and id) until the next refresh succeeds.

Nobody reading for IDLE_S puts the thread to sleep until the next read, so an idle API server
queries nothing. Each card says when it was read. Each API server worker process (uvicorn
`--workers`) keeps its own cache and thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from lakehouse.core import config
from lakehouse.core.spec import PipelineSpec, load_specs
from lakehouse.ops import history

log = logging.getLogger("lakehouse.ops.overview_cache")

REFRESH_S = 30.0  # a card is read again once it is this old (the page reloads itself as often)
RESCAN_S = 30.0  # the pipelines folder is read again this often
IDLE_S = 600.0  # no reader for this long: the thread sleeps until the next read


@dataclass(frozen=True)
class Card:
    """One spec file as the page shows it, at the time it was last read.

    `state`: "loading" (not read yet), "ok" (`overview` holds `history.public`), "error" (reading the
    pipeline failed: `error`), "broken" (the file does not load: `error`; `dags` is empty, since a file
    that does not load generates no DAGs). `dags`: the pipeline's own DAGs, all of which a user must be
    allowed to read to see the card. `read_at`: when `overview` or `error` was found.
    """

    file: str
    pipeline: str
    dags: tuple[str, ...]
    state: str
    overview: dict | None = None
    error: dict | None = None
    read_at: datetime | None = None

    def to_json(self, now: datetime) -> dict:
        age = None if self.read_at is None else round((now - self.read_at).total_seconds(), 1)
        return {"pipeline": self.pipeline, "file": self.file, "state": self.state, "error": self.error,
                "read_at": self.read_at.isoformat() if self.read_at else None, "age_s": age,
                **(self.overview or {})}


@dataclass
class _Slot:
    card: Card
    spec: PipelineSpec | None  # None: a broken file
    refreshed: float | None = None  # monotonic time of the last read (None: due now)
    generation: int = 0  # bumped when the file's spec changes: a read of an older spec is dropped


@dataclass
class _State:
    slots: dict[str, _Slot] = field(default_factory=dict)  # by file name
    scanned: float | None = None  # monotonic time of the last folder read
    folder_error: dict | None = None  # the folder itself could not be read


class OverviewCache:
    """Cards of every spec file of `directory` (default: config.pipelines_dir(), read at each rescan).

    `cards()` never blocks on I/O (a lock held only to copy references) and starts the refresher thread
    on first use; `step()` is one bounded unit of the refresher's work, also callable directly.
    """

    def __init__(self, directory: os.PathLike[str] | str | None = None, refresh_s: float = REFRESH_S,
                 rescan_s: float = RESCAN_S, idle_s: float = IDLE_S, autostart: bool = True):
        self.directory = directory
        self.refresh_s, self.rescan_s, self.idle_s = refresh_s, rescan_s, idle_s
        self.autostart = autostart
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._state = _State()
        self._last_read = time.monotonic()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the request path

    def cards(self) -> tuple[bool, list[Card], dict | None]:
        """(whether the folder has been read yet, every card by file name, the folder's error or None)."""
        with self._lock:
            now = time.monotonic()
            was_idle, self._last_read = now - self._last_read > self.idle_s, now
            if self.autostart and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="lakehouse-overview", daemon=True)
                self._thread.start()
            state = self._state
            found = [state.slots[f].card for f in sorted(state.slots)]
            ready, folder_error = state.scanned is not None, state.folder_error
        if was_idle:  # the thread may sleep until a read: this one
            self._wake.set()
        return ready, found, folder_error

    # ------------------------------------------------------------------ the refresher

    def _run(self) -> None:
        while True:
            try:
                worked = self.step()
            except Exception:  # the thread outlives any one failure; the cards keep their age
                log.exception("pipelines page: refreshing the overview failed")
                worked = False
            if worked:
                continue
            self._wake.clear()  # before looking: a read from now on wakes the wait below
            with self._lock:
                idle = time.monotonic() - self._last_read > self.idle_s
            self._wake.wait(None if idle else self._until_due())

    def _until_due(self) -> float:
        """Seconds until the next rescan or refresh is due (at least 0.2)."""
        now = time.monotonic()
        with self._lock:
            due = [(self._state.scanned or now) + self.rescan_s]
            due += [(s.refreshed or now) + self.refresh_s for s in self._state.slots.values() if s.spec is not None]
        return max(0.2, min(due) - now)

    def step(self) -> bool:
        """One bounded unit of work: read the folder when due, else refresh the one pipeline waiting longest
        when due. Whether there was anything to do."""
        now = time.monotonic()
        with self._lock:
            rescan = self._state.scanned is None or now - self._state.scanned >= self.rescan_s
            due = [(f, s, s.spec) for f, s in self._state.slots.items()
                   if s.spec is not None and (s.refreshed is None or now - s.refreshed >= self.refresh_s)]
        if rescan:
            self._rescan()
            return True
        if not due:
            return False
        file, slot, spec = min(due, key=lambda item: (item[1].refreshed is not None, item[1].refreshed or 0.0,
                                                      item[0]))
        self._refresh(file, spec, slot.generation)
        return True

    def _rescan(self) -> None:
        try:
            found = load_specs(None if self.directory is None else os.fspath(self.directory))  # read now
        except Exception as exc:  # noqa: BLE001 - an unreadable folder keeps the cards it had
            error = history.public_error("the pipelines folder", exc)
            with self._lock:
                self._state.scanned, self._state.folder_error = time.monotonic(), error
            return
        read_at = datetime.now(UTC)
        fresh: dict[str, tuple[str, PipelineSpec | None, dict | None]] = {}
        for path, broken in found.errors.items():
            file = Path(path).name
            fresh[file] = (found.declared.get(path) or Path(path).stem, None,
                           history.public_error(f"spec file {file}", broken))
        for loaded in found.specs.values():
            fresh[Path(loaded.path).name] = (loaded.name, loaded, None)
        with self._lock:
            slots = {}
            for file, (name, spec, problem) in fresh.items():
                old = self._state.slots.get(file)
                if spec is None:
                    slots[file] = _Slot(Card(file, name, (), "broken", error=problem, read_at=read_at), None)
                elif old is not None and old.spec == spec:
                    slots[file] = old
                elif old is not None and old.spec is not None and old.card.pipeline == name:
                    # an edited spec of the same pipeline: its old numbers stay until the new ones are read
                    slots[file] = _Slot(replace(old.card, dags=history.pipeline_dags(spec)), spec, None,
                                        old.generation + 1)
                else:
                    slots[file] = _Slot(Card(file, name, history.pipeline_dags(spec), "loading"), spec)
            self._state = _State(slots, time.monotonic(), None)

    def _refresh(self, file: str, spec: PipelineSpec, generation: int) -> None:
        """Read one pipeline's overview (outside the lock) and store its card, unless its spec changed meanwhile."""
        try:
            read = history.public(history.overview(spec, config.load()))
            state, error = "ok", None
        except Exception as exc:  # noqa: BLE001 - one unreadable pipeline must not blank the others
            read, state, error = None, "error", history.public_error(f"pipeline {spec.name}", exc)
        read_at = datetime.now(UTC)
        with self._lock:
            slot = self._state.slots.get(file)
            if slot is None or slot.generation != generation or slot.spec is not spec:
                return
            slot.card = Card(file, spec.name, history.pipeline_dags(spec), state, read, error, read_at)
            slot.refreshed = time.monotonic()
