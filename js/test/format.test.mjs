import { test } from "node:test";
import assert from "node:assert/strict";

import {
  MISSING,
  barFraction,
  formatBytes,
  formatDuration,
  formatPercent,
} from "../format.js";

const NOT_A_READING = [NaN, null, undefined, Infinity, -Infinity, "512", true, {}, -1, -0.001, -1e9];

function table(fn, cases) {
  for (const [input, expected] of cases) {
    assert.equal(fn(input), expected, `${fn.name}(${String(input)})`);
  }
}

test("the missing marker is an en dash", () => {
  assert.equal(MISSING, "\u2013");
});

test("formatBytes: MiB below 1024, one decimal under 100", () => {
  table(formatBytes, [
    [0, "0.0 MiB"],
    [-0, "0.0 MiB"],
    [0.04, "0.0 MiB"],
    [0.05, "0.1 MiB"],
    [3.14159, "3.1 MiB"],
    [99.94, "99.9 MiB"],
    [99.96, "100 MiB"],
    [512, "512 MiB"],
    [1023.4, "1023 MiB"],
  ]);
});

test("formatBytes: switches unit once the rounded value reaches 1024", () => {
  table(formatBytes, [
    [1023.5, "1.0 GiB"],
    [1024, "1.0 GiB"],
    [1536, "1.5 GiB"],
    [10 * 1024, "10.0 GiB"],
    [150 * 1024, "150 GiB"],
    [1024 * 1024 - 1, "1.0 TiB"],
    [2 ** 20, "1.0 TiB"],
    [2 ** 30 * 2.5, "2.5 PiB"],
    [2 ** 40, "1.0 EiB"],
  ]);
});

test("formatBytes: huge values stay in EiB", () => {
  table(formatBytes, [
    [2 ** 50, "1024 EiB"],
    [2 ** 40 * 123456, "123456 EiB"],
  ]);
});

test("formatBytes: non-readings show the dash", () => {
  for (const x of NOT_A_READING) assert.equal(formatBytes(x), MISSING, String(x));
  assert.equal(formatBytes(), MISSING);
});

test("formatPercent", () => {
  table(formatPercent, [
    [0, "0.0 %"],
    [3.14159, "3.1 %"],
    [50, "50.0 %"],
    [99.94, "99.9 %"],
    [99.96, "100 %"],
    [100, "100 %"],
    [250, "250 %"],
    [1600.4, "1600 %"],
    [1e9, "1000000000 %"],
  ]);
  for (const x of NOT_A_READING) assert.equal(formatPercent(x), MISSING, String(x));
});

test("formatDuration: seconds with two, then one decimal", () => {
  table(formatDuration, [
    [0, "0.00 s"],
    [0.004, "0.00 s"],
    [0.25, "0.25 s"],
    [1, "1.00 s"],
    [9.994, "9.99 s"],
    [9.996, "10.0 s"],
    [12.3, "12.3 s"],
    [59.94, "59.9 s"],
  ]);
});

test("formatDuration: clock from one minute, rounded to whole seconds", () => {
  table(formatDuration, [
    [59.96, "1:00"],
    [60, "1:00"],
    [75, "1:15"],
    [75.6, "1:16"],
    [599, "9:59"],
    [3599.4, "59:59"],
    [3599.6, "1:00:00"],
    [3725, "1:02:05"],
    [36000, "10:00:00"],
    [90000, "25:00:00"],
    [1e7, "2777:46:40"],
  ]);
});

test("formatDuration: non-readings show the dash", () => {
  for (const x of NOT_A_READING) assert.equal(formatDuration(x), MISSING, String(x));
});

test("barFraction: clamped ratio", () => {
  assert.equal(barFraction(0, 100), 0);
  assert.equal(barFraction(25, 100), 0.25);
  assert.equal(barFraction(512, 2048), 0.25);
  assert.equal(barFraction(100, 100), 1);
  assert.equal(barFraction(250, 100), 1);
  assert.equal(barFraction(Infinity, 100), 1);
  assert.equal(barFraction(-5, 100), 0);
  assert.equal(barFraction(1e308, 1e-308), 1);
});

test("barFraction: unknown value or unusable max gives 0", () => {
  for (const v of [NaN, null, undefined, "50"]) assert.equal(barFraction(v, 100), 0, String(v));
  for (const max of [0, -1, NaN, null, undefined, Infinity, "100"]) {
    assert.equal(barFraction(50, max), 0, String(max));
  }
  assert.equal(barFraction(NaN, NaN), 0);
});

test("formatters agree with each other on precision", () => {
  // Same number, same digits: bytes and percent share the magnitude rule.
  for (const x of [0, 1.25, 42.42, 99.94, 99.96, 512, 1000]) {
    assert.equal(formatBytes(x).replace(" MiB", ""), formatPercent(x).replace(" %", ""), String(x));
  }
});
