import { test } from "node:test";
import assert from "node:assert/strict";

import { appendWindow, typed } from "../dashboard.js";

test("appendWindow keeps the last `window` seconds of old and new points", () => {
  const { x, y, dropped } = appendWindow(
    new Float64Array([0, 1, 2, 3]), new Float32Array([10, 11, 12, 13]),
    new Float64Array([4, 5]), new Float32Array([14, 15]), 3);
  assert.deepEqual(Array.from(x), [2, 3, 4, 5]);
  assert.deepEqual(Array.from(y), [12, 13, 14, 15]);
  assert.equal(dropped, 2);
});

test("appendWindow fits the data until the window is full", () => {
  const { x, dropped } = appendWindow(new Float64Array([0]), new Float32Array([1]),
    new Float64Array([0.5]), new Float32Array([2]), 600);
  assert.deepEqual(Array.from(x), [0, 0.5]);
  assert.equal(dropped, 0);
});

test("typed reads plotly's serialized arrays, views at an offset included", () => {
  const buffer = new Float32Array([9, 1, 2]).buffer;
  const view = new DataView(buffer, 4, 8);
  assert.deepEqual(Array.from(typed({ dtype: "float32", shape: [2], value: view })), [1, 2]);
  assert.deepEqual(Array.from(typed([1, null, 3])), [1, NaN, 3]);
  assert.equal(typed(undefined).length, 0);
});
