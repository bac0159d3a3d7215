"""Bounded columnar store of samples, with exact running aggregates.

Samples land in a ring of float64 columns (one per field, plus monotonic and
wall time). When the ring is full its older half is decimated into a coarse
tier that keeps, per bucket of ``BUCKET`` samples, one row of minima and one
of maxima, so peaks survive in the timeline; the coarse tier halves its own
resolution when it fills. Memory stays under ``max_bytes`` whatever the run
length.

Statistics do not depend on what the ring still holds: every open
:class:`Window` folds each sample into running aggregates (peak, minimum,
time-weighted mean, first/last, count, duration), in vectorised blocks of
``FOLD_EVERY`` samples, so a summary over a million samples costs the same
as over ten.
"""
from __future__ import annotations

import math
import mmap
import threading
from typing import Sequence

import numpy as np

from ..options import DEFAULT_MAX_BYTES
from ..values import NAN

BUCKET = 16        # samples per min/max pair in the coarse tier
FOLD_EVERY = 64    # samples between folds into the running aggregates


class Stats:
    """Aggregates of one window, per column (numpy arrays) and overall.

    Each sample stands for the interval since the previous one (the first,
    since the window opened): the time-weighted mean is sum(v * dt) / sum(dt)
    over the samples where the column is not NaN, and falls back to the plain
    mean when no time has passed.
    """

    __slots__ = ("columns", "count", "t_open", "t_first", "t_last", "t_prev", "wall_first",
                 "wall_last", "n", "first", "last", "max", "min", "sum", "wsum", "wtime")

    def __init__(self, columns: Sequence[str], t_open: float = NAN):
        k = len(columns)
        self.columns = tuple(columns)
        self.count = 0
        self.t_open = t_open
        self.t_first = self.t_last = self.wall_first = self.wall_last = NAN
        self.t_prev = t_open
        self.n = np.zeros(k)
        self.first = np.full(k, NAN)
        self.last = np.full(k, NAN)
        self.max = np.full(k, NAN)
        self.min = np.full(k, NAN)
        self.sum = np.zeros(k)
        self.wsum = np.zeros(k)
        self.wtime = np.zeros(k)

    def copy(self) -> "Stats":
        new = Stats.__new__(Stats)
        for name in self.__slots__:
            value = getattr(self, name)
            setattr(new, name, value.copy() if isinstance(value, np.ndarray) else value)
        return new

    def fold(self, t: np.ndarray, wall: np.ndarray, rows: np.ndarray) -> None:
        """Add samples: ``t`` and ``wall`` of shape (m,), ``rows`` (k, m)."""
        m = t.shape[0]
        if m == 0:
            return
        prev = self.t_prev if self.t_prev == self.t_prev else t[0]
        dt = np.diff(t, prepend=prev)
        valid = ~np.isnan(rows)
        zeroed = np.where(valid, rows, 0.0)
        self.sum += zeroed.sum(axis=1)
        self.wsum += zeroed @ dt
        self.wtime += valid @ dt
        counts = valid.sum(axis=1)
        self.n += counts
        with np.errstate(all="ignore"):
            self.max = np.fmax(self.max, np.where(valid, rows, -np.inf).max(axis=1))
            self.min = np.fmin(self.min, np.where(valid, rows, np.inf).min(axis=1))
        has = counts > 0
        self.max[~has & np.isinf(self.max)] = NAN
        self.min[~has & np.isinf(self.min)] = NAN
        first_idx = valid.argmax(axis=1)
        last_idx = m - 1 - valid[:, ::-1].argmax(axis=1)
        cols = np.arange(rows.shape[0])
        take_first = has & np.isnan(self.first)
        self.first[take_first] = rows[cols, first_idx][take_first]
        self.last[has] = rows[cols, last_idx][has]
        if self.count == 0:
            self.t_first, self.wall_first = float(t[0]), float(wall[0])
        self.count += m
        self.t_prev = self.t_last = float(t[-1])
        self.wall_last = float(wall[-1])

    @property
    def duration(self) -> float:
        start = self.t_open if self.t_open == self.t_open else self.t_first
        return max(0.0, self.t_last - start) if self.count else 0.0

    def mean(self) -> np.ndarray:
        with np.errstate(all="ignore"):
            weighted = self.wsum / self.wtime
            plain = self.sum / self.n
        mean = np.where(self.wtime > 0, weighted, np.where(self.n > 0, plain, NAN))
        # Rounding in the sums can put the mean of a constant column an ulp above its peak.
        return np.clip(mean, self.min, self.max)

    def value(self, stat: str, column: str) -> float:
        """One statistic ('max', 'min', 'mean', 'first', 'last', 'delta' =
        last - first) of one column; NaN if unknown."""
        if column not in self.columns:
            return NAN
        j = self.columns.index(column)
        if stat == "delta":
            return float(self.last[j] - self.first[j])
        arr = self.mean() if stat == "mean" else getattr(self, stat)
        return float(arr[j])


class Window:
    """Running aggregates over the samples appended while it is open."""

    def __init__(self, store: "Store", t_open: float, seq: int):
        self.store = store
        self.seq_open = seq
        self.folded = Stats(store.columns, t_open)
        self.closed: Stats | None = None

    def stats(self) -> Stats:
        """Exact aggregates up to the latest sample (or up to close())."""
        if self.closed is not None:
            return self.closed
        return self.store._stats_of(self)

    def start_moved(self, by: float, reach: dict[str, tuple[str, ...]], bracketed: tuple[str, ...] = ()) -> None:
        """The window's true start was before its baseline sample, when the
        columns ``reach`` names stood ``by`` away from it: their first values
        move by ``by`` and count toward their own extremes and those of the
        columns ``reach`` lists for each (their peaks); the baseline's values
        of the ``bracketed`` columns (upper ends over the interval up to it)
        count toward their maxima."""
        with self.store._lock:
            f = self.folded
            index = {name: j for j, name in enumerate(f.columns)}
            for name in bracketed:
                if name in index:
                    f.max[index[name]] = np.fmax(f.max[index[name]], f.first[index[name]])
            for name, peaks in reach.items():
                if name not in index:
                    continue
                level = f.first[index[name]] = f.first[index[name]] + by
                for j in (index[c] for c in (name, *peaks) if c in index):
                    f.max[j], f.min[j] = np.fmax(f.max[j], level), np.fmin(f.min[j], level)

    def close(self) -> Stats:
        if self.closed is None:
            self.closed = self.store._close_window(self)
        return self.closed


def _lazy(shape: tuple[int, ...]) -> np.ndarray:
    """An array whose memory is touched only where written, a page at a time.

    numpy asks for transparent huge pages on large arrays: the run's first
    sample, one value per column, would fault in a 2 MiB page per column --
    some 20 MiB of the monitored process's RSS, counted as its growth."""
    size = max(1, int(np.prod(shape))) * 8
    buffer = mmap.mmap(-1, size)
    if hasattr(buffer, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buffer, dtype=np.float64, count=int(np.prod(shape))).reshape(shape)


class Store:
    """Thread-safe bounded store of samples of the given columns."""

    def __init__(self, columns: Sequence[str], max_bytes: int = DEFAULT_MAX_BYTES, t_start: float = NAN):
        self.columns = tuple(columns)
        self.t_start = t_start  # the run's start (monotonic s); the first sample's time if not given
        if len(set(self.columns)) != len(self.columns):
            # Name them: an extra source that reuses a built-in field lands here from Monitor.start().
            dups = sorted({c for c in self.columns if self.columns.count(c) > 1})
            raise ValueError(f"duplicate column name(s) {', '.join(map(repr, dups))}")
        row_bytes = 8 * (len(self.columns) + 2)
        rows = max_bytes // row_bytes
        if max_bytes < self.least_bytes(len(self.columns)):  # say what would do, not only that this does not
            raise ValueError(f"max_bytes must hold at least {8 * BUCKET} samples ({8 * BUCKET * row_bytes} "
                             f"bytes for {len(self.columns)} columns), got {max_bytes!r}")
        step = 2 * BUCKET
        self.capacity = (rows * 3 // 4) // step * step
        self.coarse_capacity = (rows - self.capacity) // 4 * 4
        k = len(self.columns)
        # Column-major: a column over time is contiguous for frames and exports.
        self._data = _lazy((k, self.capacity))
        self._t = _lazy((self.capacity,))
        self._wall = _lazy((self.capacity,))
        self._cdata = _lazy((k, self.coarse_capacity))
        self._ct = _lazy((self.coarse_capacity,))
        self._cwall = _lazy((self.coarse_capacity,))
        self._cn = 0           # rows in the coarse tier
        self._head = 0         # ring index of the oldest raw sample
        self._n = 0            # raw samples held
        self.seq = 0           # samples appended since creation
        self._folded_seq = 0   # samples already folded into the open windows
        self._windows: list[Window] = []
        self._lock = threading.Lock()
        self.nbytes = (self._data.nbytes + self._t.nbytes + self._wall.nbytes
                       + self._cdata.nbytes + self._ct.nbytes + self._cwall.nbytes)

    @staticmethod
    def least_bytes(columns: int) -> int:
        """The smallest ``max_bytes`` a store of ``columns`` columns takes."""
        return 8 * BUCKET * 8 * (columns + 2)

    def __len__(self) -> int:
        return self._n + self._cn

    # -- writing ---------------------------------------------------------
    def append(self, t: float, wall: float, row) -> None:
        with self._lock:
            if self.t_start != self.t_start:
                self.t_start = t
            if self._n == self.capacity:
                self._fold_pending()
                self._evict_half()
            i = (self._head + self._n) % self.capacity
            self._data[:, i] = row
            self._t[i] = t
            self._wall[i] = wall
            self._n += 1
            self.seq += 1
            if self.seq - self._folded_seq >= FOLD_EVERY:
                self._fold_pending()

    def _raw_range(self, seq_from: int, seq_to: int):
        """(t, wall, rows) for raw samples seq_from..seq_to-1, oldest first."""
        oldest = self.seq - self._n
        start = (self._head + (seq_from - oldest)) % self.capacity
        count = seq_to - seq_from
        idx = (start + np.arange(count)) % self.capacity if start + count > self.capacity else slice(start, start + count)
        return self._t[idx], self._wall[idx], self._data[:, idx]

    def _fold_pending(self) -> None:
        if self._folded_seq == self.seq:
            return
        for window in self._windows:
            lo = max(self._folded_seq, window.seq_open)
            if lo < self.seq:
                window.folded.fold(*self._raw_range(lo, self.seq))
        self._folded_seq = self.seq

    def _evict_half(self) -> None:
        half = self.capacity // 2
        t, wall, rows = self._raw_range(self.seq - self._n, self.seq - self._n + half)
        buckets = half // BUCKET
        shaped = rows.reshape(rows.shape[0], buckets, BUCKET)
        # fmin/fmax skip NaN, and an all-NaN bucket stays NaN without nanmin's
        # warning (catch_warnings would not do: it is not thread-safe).
        lo, hi = np.fmin.reduce(shaped, axis=2), np.fmax.reduce(shaped, axis=2)
        new = np.empty((rows.shape[0], 2 * buckets))
        new[:, 0::2], new[:, 1::2] = lo, hi
        new_t = np.empty(2 * buckets)
        new_t[0::2], new_t[1::2] = t[0::BUCKET], t[BUCKET - 1::BUCKET]
        new_wall = np.empty(2 * buckets)
        new_wall[0::2], new_wall[1::2] = wall[0::BUCKET], wall[BUCKET - 1::BUCKET]
        while self._cn + 2 * buckets > self.coarse_capacity:
            self._halve_coarse()
        end = self._cn + 2 * buckets
        self._cdata[:, self._cn:end] = new
        self._ct[self._cn:end] = new_t
        self._cwall[self._cn:end] = new_wall
        self._cn = end
        self._head = (self._head + half) % self.capacity
        self._n -= half

    def _halve_coarse(self) -> None:
        pairs = self._cn // 4
        if pairs == 0:
            self._cn = 0
            return
        d = self._cdata[:, :pairs * 4].reshape(len(self.columns), pairs, 4)
        with np.errstate(all="ignore"):
            self._cdata[:, 0:2 * pairs:2] = np.fmin(d[:, :, 0], d[:, :, 2])
            self._cdata[:, 1:2 * pairs:2] = np.fmax(d[:, :, 1], d[:, :, 3])
        for col in (self._ct, self._cwall):
            q = col[:pairs * 4].reshape(pairs, 4)
            first, last = q[:, 0].copy(), q[:, 3].copy()
            col[0:2 * pairs:2], col[1:2 * pairs:2] = first, last
        rest = self._cn - pairs * 4
        if rest:
            for arr in (self._cdata, self._ct, self._cwall):
                arr[..., 2 * pairs:2 * pairs + rest] = arr[..., pairs * 4:self._cn]
        self._cn = 2 * pairs + rest

    # -- windows ---------------------------------------------------------
    def open_window(self, t_open: float = NAN, *, baseline: bool = False) -> Window:
        """Start aggregating from the next sample. With ``baseline``, the newest
        sample held gives the window's first values (so growth counts from it)
        and its time is ``t_open``."""
        with self._lock:
            window = Window(self, t_open, self.seq)
            if baseline and self._n:
                i = (self._head + self._n - 1) % self.capacity
                window.folded.first = self._data[:, i].copy()
                window.folded.t_open = window.folded.t_prev = float(self._t[i])
            self._windows.append(window)
            return window

    def roll_window(self, window: Window, t_open: float) -> tuple[Stats, Window]:
        """Close ``window`` and open the next one at the same sample, atomically,
        so that consecutive periods neither miss nor share a sample."""
        with self._lock:
            self._fold_pending()
            if window in self._windows:
                self._windows.remove(window)
            window.closed = window.folded
            new = Window(self, t_open, self.seq)
            new.folded.t_prev = window.folded.t_last if window.folded.count else t_open
            self._windows.append(new)
            return window.closed, new

    def _stats_of(self, window: Window) -> Stats:
        with self._lock:
            stats = window.folded.copy()
            lo = max(self._folded_seq, window.seq_open)
            if lo < self.seq:
                stats.fold(*self._raw_range(lo, self.seq))
            return stats

    def _close_window(self, window: Window) -> Stats:
        with self._lock:
            self._fold_pending()
            if window in self._windows:
                self._windows.remove(window)
            return window.folded

    # -- reading ---------------------------------------------------------
    def rows_since(self, seq: int):
        """Raw samples appended at or after ``seq``: (t, wall, rows (k, m),
        next_seq, lost), where ``lost`` counts samples already decimated."""
        with self._lock:
            oldest = self.seq - self._n
            lost = max(0, oldest - seq)
            t, wall, rows = self._raw_range(max(seq, oldest), self.seq)
            return t.copy(), wall.copy(), rows.copy(), self.seq, lost

    def series(self, columns: Sequence[str] | None = None, t_from: float = -math.inf):
        """(t, wall, {column: values}) of everything held from ``t_from`` on,
        coarse tier first; copies, safe to use without the lock."""
        columns = self.columns if columns is None else columns
        idx = [self.columns.index(c) for c in columns]
        with self._lock:
            # Contiguous pieces, oldest first: the coarse tier, then the ring's one or two runs.
            pieces = [(self._cdata, self._ct, self._cwall, 0, self._cn)]
            end = self._head + self._n
            runs = [(self._head, end)] if end <= self.capacity else \
                [(self._head, self.capacity), (0, end - self.capacity)]
            pieces += [(self._data, self._t, self._wall, lo, hi) for lo, hi in runs]
            cut = [(d, t, w, lo + int(np.searchsorted(t[lo:hi], t_from)), hi) for d, t, w, lo, hi in pieces]
            t = np.concatenate([t[lo:hi] for _, t, _, lo, hi in cut])
            wall = np.concatenate([w[lo:hi] for _, _, w, lo, hi in cut])
            values = {c: np.concatenate([d[j, lo:hi] for d, _, _, lo, hi in cut])
                      for c, j in zip(columns, idx)}
        return t, wall, values

    def latest(self) -> dict[str, float]:
        """The newest sample as {column: value}, plus 't' and 'wall'; empty if none."""
        with self._lock:
            if not self._n:
                return {}
            i = (self._head + self._n - 1) % self.capacity
            out = dict(zip(self.columns, self._data[:, i].tolist()))
            out["t"], out["wall"] = float(self._t[i]), float(self._wall[i])
            return out

    def latest_known(self, lookback: int = 1024) -> dict[str, float]:
        """Like :meth:`latest`, but each column's newest value that is not NaN
        among the last ``lookback`` samples (figures read on a slower cadence
        are NaN in the samples between their reads); NaN where there is none."""
        with self._lock:
            if not self._n:
                return {}
            _t, _wall, rows = self._raw_range(max(self.seq - self._n, self.seq - lookback), self.seq)
            valid = ~np.isnan(rows)
            newest = rows.shape[1] - 1 - valid[:, ::-1].argmax(axis=1)
            values = np.where(valid.any(axis=1), rows[np.arange(rows.shape[0]), newest], NAN)
            i = (self._head + self._n - 1) % self.capacity
            out = dict(zip(self.columns, values.tolist()))
            out["t"], out["wall"] = float(self._t[i]), float(self._wall[i])
            return out
