import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { MISSING, UNITS, barFraction, fmt, isUnknown } from "../format.js";

// The table of cases nbmon/format.py is checked against too (tests/test_format.py).
const CASES_PATH = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..", "tests", "format_cases.json");
const CASES = JSON.parse(readFileSync(CASES_PATH, "utf8"));
const SPECIAL = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

// "NaN"/"Infinity"/"-Infinity" are those numbers, {"str": s} is the text s;
// anything else is itself.
function decode(value) {
  if (typeof value === "string") {
    assert.ok(value in SPECIAL, `unknown special value ${value}`);
    return SPECIAL[value];
  }
  if (value !== null && typeof value === "object" && !Array.isArray(value)) return value.str;
  return value;
}

test("the missing marker is an en dash", () => {
  assert.equal(MISSING, "\u2013");
});

test("the shared table of cases (tests/format_cases.json)", () => {
  assert.ok(CASES.length > 100);
  const failures = [];
  for (const c of CASES) {
    const got = fmt(decode(c.value), c.unit, { signed: c.signed });
    if (got !== c.text) failures.push(`fmt(${JSON.stringify(c.value)}, ${JSON.stringify(c.unit)}, signed=${c.signed}) = ${JSON.stringify(got)}, want ${JSON.stringify(c.text)}`);
  }
  assert.deepEqual(failures, []);
});

test("the table covers every unit fmt knows, and only those", () => {
  assert.deepEqual(new Set(CASES.map((c) => c.unit)), new Set(UNITS));
  for (const c of CASES) assert.deepEqual(Object.keys(c).sort(), ["signed", "text", "unit", "value"]);
});

test("signed defaults to false, and the options object is optional", () => {
  assert.equal(fmt(1536, "MiB"), "1.5 GiB");
  assert.equal(fmt(1536, "MiB", {}), "1.5 GiB");
  assert.equal(fmt(1536, "MiB", { signed: true }), "+1.5 GiB");
});

test("unknowns the JSON table cannot hold", () => {
  for (const x of [undefined, {}, [1], () => 1, 1n, Symbol("x"), new Number(3)]) {
    for (const unit of UNITS) assert.equal(fmt(x, unit), MISSING, `${String(typeof x)} in ${unit}`);
  }
  assert.equal(fmt(undefined, "s", { signed: true }), MISSING);
  assert.ok(isUnknown(null) && isUnknown(NaN) && isUnknown("1") && isUnknown(true));
  assert.ok(!isUnknown(0) && !isUnknown(-1.5));
});

test("an unknown unit is refused", () => {
  for (const unit of [" %", " MiB", "GiB", "ms", "percent", undefined, null]) {
    assert.throws(() => fmt(1, unit), /unknown unit/, String(unit));
  }
});

test("text never has an exponent or a double space", () => {
  for (const unit of UNITS) {
    for (let exp = -12; exp < 40; exp += 3) {
      for (const x of [10 ** exp, -(10 ** exp), 1.5 * 10 ** exp]) {
        const text = fmt(x, unit, { signed: true });
        assert.doesNotMatch(text.replace(/[EP]iB/, ""), /e/, `${x} ${unit}`);
        assert.doesNotMatch(text, / {2}|^ | $/, `${x} ${unit}`);
      }
    }
  }
});

test("magnitude is decided after rounding, across each boundary", () => {
  for (let i = -200; i < 200; i++) {
    assert.ok(["99.9 %", "100 %"].includes(fmt(99.95 + i * 1e-4, "%")));
    assert.ok(["1023 MiB", "1.0 GiB"].includes(fmt(1023.5 + i * 1e-3, "MiB")));
    assert.ok(["9.99 s", "10.0 s"].includes(fmt(9.995 + i * 1e-5, "s")));
    assert.ok(["59.9 s", "1:00"].includes(fmt(59.95 + i * 1e-4, "s")));
  }
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
