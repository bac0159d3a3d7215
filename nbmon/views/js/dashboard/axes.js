// The axes: every axis's range as drawn (a y axis's top in steps: axisTop()),
// the x ticks and their labels as plotly writes them, data to pixels, what a
// user's zoom or pan changed, and what a redraw would show (signature(),
// frameKey()), so that one that changes nothing is not drawn.

import { describe } from "./bands.js";

const HEADROOM = 1.05;           // a y axis's top above its highest point (plotly's own autorange margin)...
const TOP_STEPS = [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10];   // ...rounded up to one of these times 10^n
export const X_TICK_PX = 80;    // plotly's spacing of x ticks: one per 80 px at most, 5 to 10 of them

/**
 * A y axis's top for its highest point ``hi``: HEADROOM above it, rounded up
 * to TOP_STEPS (the point at 76-95 % of the axis), so that the axis moves
 * only when a peak crosses a step, not at every new high (each move is a
 * relayout, a frame of the page's to render); 0 for none.
 */
export function axisTop(hi) {
  const want = hi * HEADROOM;
  if (!(want > 0)) return 0;
  const unit = 10 ** Math.floor(Math.log10(want));
  return unit * TOP_STEPS.find((step) => step * unit >= want * (1 - 1e-12));
}

/** The highest point drawn on each axis (``axes[k]``: trace k's, "y2"), 0 where none is. */
export function tops(axes, points) {
  const out = new Map();
  points.forEach(({ y }, k) => {
    let top = out.get(axes[k]) || 0;
    for (const v of y) if (v > top) top = v;
    out.set(axes[k], top);
  });
  return out;
}

/** What plotly would draw differently, but for its axes' ranges: equal keys need only those moved. */
export function frameKey(layout) {
  return JSON.stringify(layout, (key, value) => (["range", "datarevision", "template"].includes(key) ? undefined : value));
}

/** {xaxis: [a, b], yaxis2: ...}: the range of every axis in ``layout``. */
export function axisRanges(layout) {
  const out = {};
  for (const [key, axis] of Object.entries(layout)) if (/^[xy]axis\d*$/.test(key) && axis?.range) out[key] = axis.range;
  return out;
}

export const axisKey = (id) => (id || "x").replace(/^([xy])/, "$1axis");
export const xKeys = (full) => Object.keys(full).filter((key) => /^xaxis\d*$/.test(key) && full[key]?._length);

/**
 * Plotly's ticks for a linear x axis from ``x0`` to ``x1`` over ``px``
 * pixels: a step of 1, 2 or 5 times a power of ten, above the range over
 * one tick per X_TICK_PX (4 to 9 of them, plus one); ``values`` the multiples of ``step`` in the range.
 */
export function xTicks(x0, x1, px) {
  if (!(x1 > x0) || !(px > 0)) return { values: [], step: NaN };
  const rough = (x1 - x0) / (Math.min(9, Math.max(4, px / X_TICK_PX)) + 1);
  const base = 10 ** Math.floor(Math.log10(rough));
  const step = base * [2, 5, 10].find((m) => m > rough / base);   // plotly's roundUp: the next one up
  const values = [];
  for (let k = Math.ceil(x0 / step - 1e-9); k * step <= x1 + step * 1e-9; k++) values.push(k * step + 0);   // not -0
  return { values, step };
}

/**
 * A tick's label as plotly writes it: the decimals ``step`` needs, no
 * trailing zeros ("0", "0.5", "1"), thousands as "k" where the axis reaches
 * 10,000 (``values``: its ticks), a minus sign for negatives.
 */
export function tickText(v, step, values = [v]) {
  const k = values.some((t) => Math.abs(t) >= 1e4) ? 1e3 : 1;
  const decimals = Math.max(0, -Math.floor(Math.log10(step / k) + 1e-9));
  const number = String(+(v / k).toFixed(decimals) + 0);   // + 0: not "-0"
  return `${number.replace("-", "\u2212")}${k > 1 ? "k" : ""}`;
}

/** Data to pixels on a plotly axis as it shows now: its range, offset and length (y: upwards). */
export function scale(axis, upwards) {
  const [r0, r1] = axis.range;
  const k = axis._length / (r1 - r0 || 1);
  return upwards ? (v) => axis._offset + axis._length - (v - r0) * k : (v) => axis._offset + (v - r0) * k;
}

/**
 * Every axis's range as drawn (the kernel's axes are all "tozero"): the x
 * axes ``range``, the streams' y axes from 0 to axisTop() of their
 * ``top``, or the user's zoom of them; an axis the kernel
 * gave a range keeps it. Each axis a copy (plotly writes its ranges into
 * the layout it draws, which must not be the model's), with ``revision``,
 * which a user's autoscale moves: plotly would keep autoscaling (its
 * "uirevision"); a revision that moved at every redraw would cost a sixth
 * of one.
 */
export function ranges(stored, range, top, zoom = {}, revision = 0) {
  const out = {};
  const set = (key, r) => (out[key] = { ...stored[key], range: [...r], autorange: false, uirevision: revision });
  for (const key of Object.keys(stored)) if (/^xaxis\d*$/.test(key)) set(key, [range.x0, range.x1]);
  for (const [axis, hi] of top) {
    const key = axis.replace("y", "yaxis");
    const given = stored[key]?.range;
    set(key, zoom[key] ?? (given && !stored[key].autorange ? given : [0, axisTop(hi) || 1]));
  }
  return out;
}

/**
 * What a redraw would show, in pixels: equal signatures draw the same
 * picture, so the second is not drawn. Each point's column and height (on a
 * scale from 0 to the highest point of its axis, ``axes[k]`` for trace k,
 * ``top`` by axis), each band's ends and text, the range's width in pixels,
 * and ``more`` (theme, size, the kernel's edits).
 */
export function signature(axes, top, points, groups, range, px, full, more = []) {
  const scale = px / (range.x1 - range.x0 || 1);
  const parts = [px, ...more];
  points.forEach(({ x, y }, k) => {
    const height = full?.[axes[k].replace("y", "yaxis")]?._length || 150;
    const yscale = height / (axisTop(top.get(axes[k])) || 1);
    const cells = new Int32Array(2 * x.length);
    for (let i = 0; i < x.length; i++) {
      cells[2 * i] = Math.round((x[i] - range.x0) * scale);
      cells[2 * i + 1] = Number.isNaN(y[i]) ? -1 : Math.round(y[i] * yscale);
    }
    parts.push(cells.join(","));
  });
  const px0 = (t) => Math.round((t - range.x0) * scale);
  for (const g of groups) parts.push(`${px0(g.a)}:${px0(g.b)}:${describe(g).hover}`);
  return parts.join("|");
}

/**
 * The axes a plotly_relayout ``change`` from the user zoomed, panned or
 * reset: {xaxis2: [a, b], yaxis: null (autorange), ...}; the x axes (they
 * match) as "x"; null when it touched none.
 */
export function userRanges(change) {
  const out = {};
  for (const [k, v] of Object.entries(change || {})) {
    const m = /^([xy])axis(\d*)\.(autorange|range\[0\]|range)$/.exec(k);
    if (!m) continue;
    const key = m[1] === "x" ? "x" : `yaxis${m[2]}`;
    if (m[3] === "autorange") out[key] = null;
    else if (m[3] === "range") out[key] = v;
    else out[key] = [v, change[k.replace("[0]", "[1]")]];
  }
  return Object.keys(out).length ? out : null;
}
