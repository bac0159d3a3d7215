// The points a view holds: a Series per trace (bounded: older points merge
// into min/max pairs past MAX_HELD; hover texts formatted once), what a redraw
// draws of them (decimate(): at most two points a column), and arrays as
// plotly's serializer ships them.

import { fmt } from "../format.js";

export const MAX_HELD = 20000;  // points held per trace; past it, the oldest half merges into min/max pairs

/** The points of one trace in the window, with their hover texts. */
export class Series {
  constructor(unit, capacity = MAX_HELD) {
    this.unit = unit;
    this.capacity = capacity;
    this.x = new Float64Array(capacity);
    this.y = new Float32Array(capacity);
    this.text = new Array(capacity);
    this.start = 0;
    this.end = 0;
  }

  get length() {
    return this.end - this.start;
  }

  get first() {
    return this.length ? this.x[this.start] : NaN;
  }

  get last() {
    return this.length ? this.x[this.end - 1] : NaN;
  }

  /** Append points (x ascending), formatting each one's hover text once. */
  push(xs, ys) {
    for (let i = 0; i < xs.length; i++) {
      if (this.end === this.capacity) this.makeRoom();
      this.x[this.end] = xs[i];
      this.y[this.end] = ys[i];
      this.text[this.end] = fmt(ys[i], this.unit);
      this.end += 1;
    }
  }

  clear() {
    this.start = this.end = 0;
  }

  /** Drop the points before ``x`` (the oldest one that the window shows stays first). */
  trim(x) {
    while (this.start < this.end - 1 && this.x[this.start] < x) this.start += 1;
  }

  makeRoom() {
    if (this.length >= this.capacity / 2) {
      // Full: the older half becomes one min/max pair per four points (every extreme stays).
      const half = this.start + (this.length >> 1);
      let w = this.start;   // never ahead of what is read: two written per four read
      for (let i = this.start; i < half; i += 4) {
        let lo = i, hi = i;
        for (let j = i + 1; j < Math.min(i + 4, half); j++) {
          if (this.y[j] < this.y[lo]) lo = j;
          if (this.y[j] > this.y[hi]) hi = j;
        }
        const [a, b] = lo <= hi ? [lo, hi] : [hi, lo];
        this.copy(a, w++);
        if (b !== a) this.copy(b, w++);
      }
      this.move(half, this.end, w);
      this.end = w + (this.end - half);
    }
    this.move(this.start, this.end, 0);
    this.end -= this.start;
    this.start = 0;
  }

  copy(from, to) {
    this.x[to] = this.x[from];
    this.y[to] = this.y[from];
    this.text[to] = this.text[from];
  }

  move(from, to, at) {
    if (from === at) return;
    this.x.copyWithin(at, from, to);
    this.y.copyWithin(at, from, to);
    for (let i = 0; i < to - from; i++) this.text[at + i] = this.text[from + i];
  }

  /** Index of the first point with x >= t (binary search). */
  index(t) {
    let lo = this.start, hi = this.end;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.x[mid] < t) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}

/**
 * The points of ``series`` between x0 and x1 to draw on ``columns`` columns:
 * all of them when they are fewer than two per column, else each column's
 * lowest and highest point, in time order (NaN skipped). ``edges`` adds the
 * point just outside each end, so that a line reaches a range fixed by a zoom.
 */
export function decimate(series, x0, x1, columns, edges = false) {
  let from = series.index(x0);
  let to = series.index(x1);
  while (to < series.end && series.x[to] <= x1) to += 1;
  if (edges) {
    from = Math.max(series.start, from - 1);
    to = Math.min(series.end, to + 1);
  }
  const pick = [];
  if (to - from <= 2 * columns) {
    for (let i = from; i < to; i++) pick.push(i);
  } else {
    const scale = columns / (x1 - x0 || 1);
    let column = -1, lo = -1, hi = -1;
    const flush = () => {
      if (lo < 0) return;
      if (lo === hi) pick.push(lo);
      else pick.push(Math.min(lo, hi), Math.max(lo, hi));
    };
    for (let i = from; i < to; i++) {
      const c = Math.floor((series.x[i] - x0) * scale);
      if (c !== column) {
        flush();
        column = c;
        lo = hi = -1;
      }
      const v = series.y[i];
      if (Number.isNaN(v)) continue;
      if (lo < 0 || v < series.y[lo]) lo = i;
      if (hi < 0 || v > series.y[hi]) hi = i;
    }
    flush();
  }
  const x = new Float64Array(pick.length);
  const y = new Float32Array(pick.length);
  const text = new Array(pick.length);
  pick.forEach((i, k) => {
    x[k] = series.x[i];
    y[k] = series.y[i];
    text[k] = series.text[i];
  });
  return { x, y, text };
}

/** Index of the value in ascending ``xs`` (not empty) nearest ``t``. */
export function nearest(xs, t) {
  let lo = 0, hi = xs.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < t) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 && t - xs[lo - 1] < xs[lo] - t ? lo - 1 : lo;
}

// -- arrays as plotly's serializer ships them: {dtype, shape, value} --------

const TYPED = { float32: Float32Array, float64: Float64Array, int32: Int32Array, uint32: Uint32Array };

export function typed(value) {
  if (value == null) return new Float64Array(0);
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) return value;
  if (Array.isArray(value)) return Float64Array.from(value, (v) => (v == null ? NaN : v));
  const Type = TYPED[value.dtype] || Float64Array;
  const buf = value.value ?? value.buffer;
  const view = ArrayBuffer.isView(buf) ? buf : new DataView(buf);
  return new Type(view.buffer, view.byteOffset, view.byteLength / Type.BYTES_PER_ELEMENT);
}

export function bufferOf(dataView, Type) {
  return new Type(dataView.buffer.slice(dataView.byteOffset, dataView.byteOffset + dataView.byteLength));
}
