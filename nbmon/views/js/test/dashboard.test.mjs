import { test } from "node:test";
import assert from "node:assert/strict";

import { DUTY, REDRAW_MAX_MS, REDRAW_MIN_MS, redrawWait } from "../dashboard/page.js";
import { paintScene } from "../dashboard/paint.js";
import { MAX_HELD, Series, decimate, nearest, typed } from "../dashboard/series.js";
import { MERGE_PX, bandGroups, describe, steady } from "../dashboard/bands.js";
import { contrast, muted, over, parseColor } from "../dashboard/theme.js";
import {
  X_TICK_PX, axisRanges, axisTop, frameKey, ranges, signature, tickText, tops, userRanges, xTicks,
} from "../dashboard/axes.js";

function series(ys, step = 0.1, capacity = MAX_HELD) {
  const s = new Series("%", capacity);
  s.push(Float64Array.from(ys, (_, i) => i * step), Float32Array.from(ys));
  return s;
}

test("a series keeps the window: trim drops older points, texts are formatted once", () => {
  const s = series([10, 11, 12, 13, 14, 15], 1);
  s.trim(2);
  assert.equal(s.length, 4);
  assert.equal(s.first, 2);
  assert.deepEqual(s.text.slice(s.start, s.end), ["12.0 %", "13.0 %", "14.0 %", "15.0 %"]);
});

test("a full series merges its older half into min/max pairs: bounded, every extreme kept", () => {
  const ys = Array.from({ length: 50_000 }, (_, i) => (i % 7) + (i === 1234 ? 900 : 0) - (i === 777 ? 50 : 0));
  const s = series(ys, 0.01, 1000);
  assert.ok(s.length <= 1000, s.length);
  const held = Array.from(s.y.subarray(s.start, s.end));
  assert.ok(held.includes(906) || held.includes(900 + (1234 % 7)), "the spike survived");
  assert.ok(held.includes((777 % 7) - 50), "the dip survived");
  const xs = Array.from(s.x.subarray(s.start, s.end));
  assert.ok(xs.every((x, i) => i === 0 || x > xs[i - 1]), "time order kept");
  assert.equal(s.last, (ys.length - 1) * 0.01);
});

test("decimate draws at most two points per column, and a one-sample spike keeps its sample", () => {
  const ys = Array.from({ length: 6000 }, () => 5);
  ys[4321] = 500;
  const s = series(ys);
  const { x, y, text } = decimate(s, 0, 599.9, 400);
  assert.ok(x.length <= 800, x.length);
  assert.ok(Array.from(y).includes(500));
  assert.equal(x[Array.from(y).indexOf(500)], s.x[4321]);
  assert.equal(text[Array.from(y).indexOf(500)], "500 %");
  assert.ok(Array.from(x).every((v, i) => i === 0 || v >= x[i - 1]));
});

test("decimate keeps only the range; with edges, the points just outside too", () => {
  const s = series(Array.from({ length: 100 }, (_, i) => i), 1);
  assert.deepEqual(Array.from(decimate(s, 10, 20, 100).x), [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]);
  const edged = Array.from(decimate(s, 10.5, 19.5, 100, true).x);
  assert.equal(edged[0], 10);
  assert.equal(edged[edged.length - 1], 20);
});

test("bands: only inside the range, quick neighbours merged, wide cells alone", () => {
  const cells = [];
  for (let i = 0; i < 1000; i++) cells.push({ id: `q${i}`, n: 10 + i, t0: 100 + i * 0.03, t1: 100 + i * 0.03 + 0.001 });
  cells.push({ id: "long", n: 2000, label: "train", t0: 200, t1: 260 });
  cells.push({ id: "old", n: 1, t0: 0, t1: 5 });
  const pxPerS = 800 / 600;
  const groups = bandGroups(cells, 10, 610, pxPerS, 610);
  assert.equal(groups.length, 2, JSON.stringify(groups.map((g) => [g.a, g.b, g.cells.length])));
  assert.equal(groups[0].cells.length, 1000);
  assert.deepEqual(describe(groups[0]), { label: "[10]–[1009]", hover: "In [10]–[1009] · 1000 cells · 1.00 s" });
  assert.deepEqual(describe(groups[1]), { label: "[2000]", hover: "In [2000] train · 1:00" });
  // wide enough to tell apart: each its own band, at least a pixel wide
  const apart = bandGroups(cells.slice(0, 1000), 100, 101, 10_000, 101);
  assert.ok(apart.length > 30, apart.length);
  assert.ok(apart.every((g) => (g.b - g.a) * 10_000 >= 1 - 1e-9));
  // never more bands than the width allows
  assert.ok(bandGroups(cells, 0, 600, pxPerS, 600).length <= 800 / MERGE_PX + 1);
});

test("a running cell ends at the newest point", () => {
  const [g] = bandGroups([{ id: "r", n: 3, t0: 5, t1: null }], 0, 10, 80, 9);
  assert.equal(g.b, 9);
  assert.equal(describe(g).hover, "In [3]  · running");
});

test("muted text still reads: contrast of at least 4.5 on light and dark", () => {
  for (const [fg, bg] of [[[0, 0, 0, 0.87], [255, 255, 255, 1]], [[255, 255, 255, 0.87], [17, 17, 17, 1]]]) {
    const band = over([128, 128, 128, 0.1], bg);
    const text = muted(over(fg, bg), band);
    assert.ok(contrast(text, band) >= 4.5, contrast(text, band));
    assert.ok(contrast(text, band) < contrast(over(fg, bg), band), "muted, not the full text colour");
  }
  assert.deepEqual(parseColor("rgba(255, 255, 255, 0.87)"), [255, 255, 255, 0.87]);
  assert.deepEqual(parseColor("#fff"), [255, 255, 255, 1]);
  assert.equal(Math.round(contrast([0, 0, 0, 1], [255, 255, 255, 1])), 21);
});

test("the signature changes when a point moves a pixel, not before", () => {
  const s = series(Array.from({ length: 6000 }, (_, i) => 10 + (i % 3)), 0.1);
  const range = { x0: 0, x1: 599.9 };
  const sign = () => {
    const points = [decimate(s, range.x0, range.x1, 400)];
    return signature(["y"], tops(["y"], points), points, [], range, 800, null);
  };
  const first = sign();
  assert.equal(sign(), first);
  s.y[s.end - 1] += 0.001;   // far below a pixel
  assert.equal(sign(), first);
  s.y[s.end - 1] = 40;       // a new peak: the axis and every point move
  assert.notEqual(sign(), first);
});

test("a y axis's top: 5 % above its highest point, rounded up to a step, moving only when a peak crosses one", () => {
  assert.equal(axisTop(7), 8);
  assert.equal(axisTop(100), 120);
  assert.equal(axisTop(0.3), 0.4);
  assert.equal(axisTop(9.5), 10);
  assert.equal(axisTop(0), 0);
  assert.equal(axisTop(NaN), 0);
  for (const hi of [0.013, 0.9, 3.3, 47, 99, 151, 7321, 2.5e6]) {
    const top = axisTop(hi);
    assert.ok(top >= hi * 1.05 && hi >= 0.75 * top, `${hi} -> ${top}`);   // the point at 75-95 % of the axis
  }
  // a noisy idle CPU: new highs under a step leave the axis where it was
  const drawn = new Set([2.1, 2.2, 2.35, 2.38].map(axisTop));
  assert.deepEqual([...drawn], [2.5]);
});

test("every range is given: the window, each axis's top, the kernel's own, the user's zoom", () => {
  const stored = {
    xaxis: { matches: "x2" }, xaxis2: {}, yaxis: { range: [0, 100] }, yaxis2: { title: { text: "kernel" } },
  };
  const top = tops(["y", "y2", "y2"], [{ y: [50] }, { y: [3, NaN, 7] }, { y: [] }]);
  const out = ranges(stored, { x0: 10, x1: 70 }, top, {}, 2);
  assert.deepEqual(out.xaxis.range, [10, 70]);
  assert.deepEqual(out.xaxis2.range, [10, 70]);
  assert.deepEqual(out.yaxis.range, [0, 100]);            // given by the kernel
  assert.deepEqual(out.yaxis2.range, [0, axisTop(7)]);
  assert.equal(out.yaxis2.title.text, "kernel");
  assert.ok(Object.values(out).every((a) => a.autorange === false && a.uirevision === 2));
  assert.equal(stored.yaxis2.range, undefined);           // the model's layout is not written
  assert.deepEqual(ranges(stored, { x0: 0, x1: 1 }, tops(["y2"], [{ y: [] }])).yaxis2.range, [0, 1]);
  assert.deepEqual(ranges(stored, { x0: 0, x1: 1 }, top, { yaxis2: [2, 4] }).yaxis2.range, [2, 4]);
});

test("userRanges reads a zoom, a pan and an autoscale of either axis", () => {
  assert.deepEqual(userRanges({ "xaxis2.range[0]": 3, "xaxis2.range[1]": 9, "yaxis3.range[0]": 1, "yaxis3.range[1]": 2 }),
    { x: [3, 9], yaxis3: [1, 2] });
  assert.deepEqual(userRanges({ "xaxis.range": [1, 2] }), { x: [1, 2] });
  assert.deepEqual(userRanges({ "xaxis.autorange": true, "yaxis.autorange": true }), { x: null, yaxis: null });
  assert.equal(userRanges({ width: 500 }), null);
  assert.equal(userRanges(undefined), null);
});

test("typed reads plotly's serialized arrays, views at an offset included", () => {
  const buffer = new Float32Array([9, 1, 2]).buffer;
  const view = new DataView(buffer, 4, 8);
  assert.deepEqual(Array.from(typed({ dtype: "float32", shape: [2], value: view })), [1, 2]);
  assert.deepEqual(Array.from(typed([1, null, 3])), [1, NaN, 3]);
  assert.equal(typed(undefined).length, 0);
});

test("new points wait as long as keeps the page's redraws within DUTY of its main thread", () => {
  // 25 ms a redraw, one dashboard: 1 % of the time is a redraw every 2.5 s
  assert.equal(redrawWait(25, 1), 25 / DUTY);
  assert.equal(redrawWait(25, 1), 2500);
  // two dashboards share the budget: each waits twice as long
  assert.equal(redrawWait(20, 2), 2 * redrawWait(20, 1));
  // a fast machine stays as live as the frames allow, a slow one still moves
  assert.equal(redrawWait(2, 1), REDRAW_MIN_MS);
  assert.equal(redrawWait(400, 1), REDRAW_MAX_MS);
  // before any redraw is timed (the first builds the plot): the shortest wait
  assert.equal(redrawWait(NaN, 1), REDRAW_MIN_MS);
  assert.equal(redrawWait(25, 0), redrawWait(25, 1));
});

test("a layout that differs only in its axes' ranges needs only those redrawn", () => {
  const layout = (x1, label) => ({
    xaxis: { range: [0, x1], title: { text: "s" } }, yaxis2: { range: [0, x1 / 2] }, datarevision: x1,
    template: { layout: {} }, shapes: [{ x0: 1, name: label }],
  });
  assert.equal(frameKey(layout(10, "[1]")), frameKey(layout(11, "[1]")));
  assert.notEqual(frameKey(layout(10, "[1]")), frameKey(layout(10, "[2]")));
  assert.deepEqual(axisRanges(layout(10, "")), { xaxis: [0, 10], yaxis2: [0, 5] });
});

test("a band that would move by less than half a pixel stays as drawn", () => {
  const band = (x0, x1) => ({ x0, x1 });
  const drawn = [band(10, 10.5)];
  assert.equal(steady([band(10.001, 10.501)], drawn, 100), drawn);   // 0.1 px
  assert.notEqual(steady([band(10.01, 10.5)], drawn, 100), drawn);   // 1 px
  assert.notEqual(steady([band(10, 10.5), band(20, 21)], drawn, 100), drawn);
});

test("the hover reads the drawn point nearest the pointer", () => {
  const xs = Float64Array.from([0, 1, 2, 4]);
  assert.deepEqual([-1, 0.4, 0.6, 2.9, 3.1, 9].map((t) => nearest(xs, t)), [0, 0, 1, 2, 3, 3]);
  assert.equal(nearest(Float64Array.from([5]), 0), 0);
});

test("x ticks as plotly places them: 1, 2 or 5 times ten to a power, one per 80 px at most", () => {
  assert.deepEqual(xTicks(0, 10, 800), { values: [0, 2, 4, 6, 8, 10], step: 2 });
  assert.deepEqual(xTicks(-0.4, 3, 800).values, [0, 0.5, 1, 1.5, 2, 2.5, 3]);
  assert.deepEqual(xTicks(48.7, 78.6, 800).values, [50, 55, 60, 65, 70, 75]);
  assert.deepEqual(xTicks(0, 1, 200).values, [0, 0.5, 1]);
  for (const [x0, x1, px] of [[0, 600, 800], [3.3, 3.9, 400], [-5, 120, 1000], [7200, 7800, 700]]) {
    const { values, step } = xTicks(x0, x1, px);
    assert.ok(values.length >= 3 && values.length <= 11, `${x0}..${x1}: ${values}`);
    assert.ok(values.every((v) => v >= x0 - 1e-9 && v <= x1 + 1e-9));
    assert.ok(px / (values.length - 1) >= 0.8 * X_TICK_PX || values.length <= 5);
    assert.ok([1, 2, 5].some((m) => Math.abs(step / 10 ** Math.floor(Math.log10(step)) - m) < 1e-9));
  }
  assert.deepEqual(xTicks(5, 5, 800).values, []);
});

test("tick labels read as plotly writes them: the step's decimals and no trailing zeros, k past 10,000, a minus sign", () => {
  assert.equal(tickText(0.6000000000000001, 0.2), "0.6");
  assert.equal(tickText(55, 5), "55");
  assert.equal(tickText(1, 0.5), "1");
  assert.equal(tickText(1e-17, 0.1), "0");
  assert.equal(tickText(-2, 1), "\u22122");
  assert.equal(tickText(-0, 1), "0");
  assert.equal(tickText(12500, 500, [12000, 12500]), "12.5k");
  assert.equal(tickText(9000, 1000, [8000, 9000]), "9000");
});

/** A 2D context that keeps its calls, and what each fill or stroke drew with. */
function recordingContext() {
  const calls = [];
  const state = { fillStyle: "", strokeStyle: "", lineWidth: 1, font: "", textAlign: "", textBaseline: "", lineJoin: "" };
  const ctx = new Proxy(state, {
    get(target, key) {
      if (key === "canvas") return canvas;
      if (key in target) return target[key];
      return (...args) => calls.push([key, ...args.map((a) => (ArrayBuffer.isView(a) ? [...a] : a))]);
    },
    set(target, key, value) {
      target[key] = value;
      return true;
    },
  });
  const canvas = { width: 0, height: 0 };
  return { ctx, calls, canvas, state };
}

test("a scene paints as given: sized for the pixel ratio, lines clipped to their subplot, fills down to their base, texts last", () => {
  const { ctx, calls, canvas } = recordingContext();
  paintScene(ctx, {
    w: 300, h: 200, ratio: 2, rects: [[10, 20, 30, 40, "band"]],
    grids: [{ xs: [50.5, 100.5], top: 20, bottom: 180, color: "grid", width: 1 }],
    lines: [{ clip: [10, 20, 280, 160], xy: Float32Array.of(10, 180, 20, 30, 30, 170), fill: "fillc", base: 180,
      width: 2, color: "c", dash: [] },
    { clip: [0, 0, 1, 1], xy: new Float32Array(0), fill: null, base: 0, width: 2, color: "d", dash: [] }],
    texts: [{ text: "[3]", x: 12, y: 22, font: "10px ui", color: "lab", clip: [10, 20, 280, 14] },
      { text: "CPU 12 %", x: 3, y: 4, font: "14px t", color: "title" }],
  });
  assert.deepEqual([canvas.width, canvas.height], [600, 400]);
  const names = calls.map(([name]) => name);
  assert.deepEqual(calls.find(([n]) => n === "setTransform"), ["setTransform", 2, 0, 0, 2, 0, 0]);
  assert.deepEqual(calls.find(([n]) => n === "fillRect"), ["fillRect", 10, 20, 30, 40]);
  // the line: clipped, its path through every point, closed down to its base for the fill, then stroked
  const line = calls.slice(names.indexOf("clip"));
  assert.deepEqual(line.slice(0, 6).map(([n]) => n), ["clip", "beginPath", "moveTo", "lineTo", "lineTo", "save"]);
  assert.deepEqual(line.filter(([n]) => n === "lineTo").map((c) => c.slice(1)), [[20, 30], [30, 170], [30, 180], [10, 180]]);
  assert.ok(names.indexOf("fill") < names.indexOf("stroke", names.indexOf("fill")));
  // the empty line draws nothing; the texts come after every line, the label clipped to its strip
  assert.equal(calls.filter(([n]) => n === "moveTo").length, 3);   // two grid lines, one line
  const texts = calls.filter(([n]) => n === "fillText");
  assert.deepEqual(texts, [["fillText", "[3]", 12, 22], ["fillText", "CPU 12 %", 3, 4]]);
  assert.ok(names.lastIndexOf("stroke") < names.indexOf("fillText"));
  assert.deepEqual(calls.filter(([n]) => n === "rect").at(-1), ["rect", 10, 20, 280, 14]);
});

test("a scene on a canvas already its size keeps the canvas (a resize would clear and reallocate it)", () => {
  const { ctx, canvas } = recordingContext();
  const scene = { w: 100, h: 50, ratio: 1, rects: [], grids: [], lines: [], texts: [] };
  paintScene(ctx, scene);
  let resized = 0;
  const { width, height } = canvas;
  Object.defineProperty(canvas, "width", { get: () => width, set: () => { resized += 1; } });
  Object.defineProperty(canvas, "height", { get: () => height, set: () => { resized += 1; } });
  paintScene(ctx, scene);
  assert.equal(resized, 0);
});
