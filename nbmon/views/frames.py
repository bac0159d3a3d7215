"""Frames for the live chart: the last seconds of a few store columns,
reduced to a fixed number of points per trace, as float32 numpy arrays.

Pure numpy (no plotly): the live dashboard assigns these arrays to plotly
traces, and plotly's widget serializer ships 1-D float32 numpy arrays as
binary comm buffers (4 bytes a value) rather than JSON lists (~10 bytes a
value). Reduction is min/max decimation: every bucket keeps its lowest and
highest sample, in time order, so a one-sample spike still shows whatever
the zoom. Everything is vectorised: no Python loop runs per sample.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

DEFAULT_BUDGET = 2000                 # points per trace
MAX_FRAME_BYTES = 64 * 1024           # array payload of one frame, all traces
_EMPTY = np.empty(0, dtype=np.float32)
_EMPTY.flags.writeable = False


def _check_budget(budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 2:
        raise ValueError(f"budget must be a whole number of points >= 2, got {budget!r}")
    return int(budget)


def _nan_aware(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """argmin, argmax per row of a 2-D block ignoring NaN; an all-NaN row gives 0, 0."""
    nan = np.isnan(block)
    lo = np.where(nan, np.inf, block).argmin(axis=1)
    hi = np.where(nan, -np.inf, block).argmax(axis=1)
    return lo, hi


def _block_minmax(block: np.ndarray, base: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """For a (rows, size) block of consecutive buckets starting at index
    ``base``: each bucket's earlier and later index of its min and max."""
    lo = block.argmin(axis=1)
    hi = block.argmax(axis=1)
    # argmin/argmax stop at the first NaN: redo only the rows that have one.
    rows = np.arange(block.shape[0])
    bad = np.isnan(block[rows, hi])
    if bad.any():
        lo[bad], hi[bad] = _nan_aware(block[bad])
    starts = base + rows * size
    return np.minimum(lo, hi) + starts, np.maximum(lo, hi) + starts


def minmax_indices(values: np.ndarray, budget: int) -> np.ndarray | None:
    """Indices (ascending, exactly ``budget`` rounded down to even) of each
    bucket's min and max, or None when ``values`` has at most ``budget`` points.

    The series is cut into ``budget // 2`` consecutive buckets whose lengths
    differ by at most one; each bucket contributes two indices, its
    minimum's and its maximum's, earliest first (the same index twice for a
    flat bucket). NaN is ignored unless the whole bucket is NaN, and then the
    bucket's first index stands for it (its value is NaN).
    """
    budget = _check_budget(budget)
    values = np.asarray(values)
    n = values.shape[0]
    if n <= budget:
        return None
    buckets = budget // 2
    size, longer = divmod(n, buckets)    # `longer` buckets of size+1, then size
    split = longer * (size + 1)
    parts = []
    if longer:
        parts.append(_block_minmax(values[:split].reshape(longer, size + 1), 0, size + 1))
    parts.append(_block_minmax(values[split:].reshape(buckets - longer, size), split, size))
    out = np.empty(2 * buckets, dtype=np.intp)
    out[0::2] = np.concatenate([p[0] for p in parts])
    out[1::2] = np.concatenate([p[1] for p in parts])
    return out


def build_frame(store, columns: Sequence[str], window_s: float,
                budget_per_trace: int = DEFAULT_BUDGET, *, max_bytes: int = MAX_FRAME_BYTES,
                origin: float | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The last ``window_s`` seconds of ``columns`` as ``{column: (x, y)}``.

    ``x`` is float32 seconds relative to the newest sample (<= 0, 0 = now),
    or to ``origin`` (a time on the store's clock) when given, and ``y``
    the float32 values; each trace has its own ``x`` because min/max
    decimation keeps different samples for different columns (traces that
    were not decimated share one ``x`` array). Columns the store lacks are
    left out; with no samples yet every present column maps to two empty
    arrays. Each trace gets at most ``budget_per_trace`` points and fewer
    when needed to keep the frame's total payload within ``max_bytes``
    (8 bytes a point: x and y).
    """
    if not (isinstance(window_s, (int, float)) and window_s > 0):
        raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")
    budget_per_trace = _check_budget(budget_per_trace)
    have = set(store.columns)
    present = [c for c in dict.fromkeys(columns) if c in have]
    if not present:
        return {}
    budget = min(budget_per_trace, max_bytes // (8 * len(present))) // 2 * 2
    if budget < 2:
        raise ValueError(f"max_bytes={max_bytes!r} is too small for {len(present)} traces")
    latest = store.latest()
    if not latest:
        return {c: (_EMPTY, _EMPTY) for c in present}
    t_from = latest["t"] - window_s if math.isfinite(window_s) else -math.inf
    t, _wall, values = store.series(present, t_from=t_from)
    if t.shape[0] == 0:
        return {c: (_EMPTY, _EMPTY) for c in present}
    t_now = t[-1]
    zero = t_now if origin is None else origin
    # A sample may have landed between latest() and series(): re-cut the window.
    start = int(np.searchsorted(t, t_now - window_s)) if math.isfinite(window_s) else 0
    t = t[start:]
    frame = {}
    shared_x = None
    for c in present:
        v = values[c][start:]
        idx = minmax_indices(v, budget)
        if idx is None:
            if shared_x is None:
                shared_x = (t - zero).astype(np.float32)
            frame[c] = (shared_x, v.astype(np.float32))
        else:
            frame[c] = ((t[idx] - zero).astype(np.float32), v[idx].astype(np.float32))
    return frame


def frame_bytes(frame: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> int:
    """Array payload of a frame in bytes, as sent: every trace's x and y
    (an x shared by several traces is sent once per trace)."""
    return int(sum(x.nbytes + y.nbytes for x, y in frame.values()))
