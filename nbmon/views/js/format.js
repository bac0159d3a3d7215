// Numbers with units, as text for humans: the cell meter's copy of the rules in
// nbmon/format.py. Pure functions, no DOM. Both are checked against the same
// table of cases, tests/format_cases.json, so the live meter and the static
// record that replaces it always agree.
//
// fmt(value, unit, {signed})   unit is a catalog unit: "%", "MiB", "s", "B",
//                              "B/s", "W", "MHz", "°C", "CPUs", or "" for a
//                              count; any other unit throws.
//   * Unknown (null, undefined, NaN, ±Infinity, booleans, strings, anything
//     not a number): "–" (U+2013). Python sends None, which arrives as null.
//   * Magnitude: one decimal below 100, whole numbers from 100 on, decided
//     after rounding (99.96 -> "100"); number and unit apart by one space.
//   * Rounding is half away from zero on the exact binary value (toFixed's
//     rule; nbmon/format.py does the same with Decimal).
//   * "MiB", "B", "B/s": binary units B, KiB, MiB, GiB, TiB, PiB, EiB (MiB
//     starts at MiB), the next one once the rounded value reaches 1024:
//     512 -> "512 MiB", 1023.96 -> "1.0 GiB", 1536 -> "1.5 GiB".
//   * "s": below 10 s two decimals ("0.25 s"), below 60 s one ("12.3 s"),
//     then a clock rounded to whole seconds: "m:ss" ("1:15"), from one hour
//     "h:mm:ss" ("1:02:05"); hours are not wrapped into days.
//   * "" and "CPUs" (counts): whole numbers without decimals ("12", "2 CPUs"),
//     others by the magnitude rule ("0.5", "2.5 CPUs").
//   * "W", "MHz", "°C", "%": the magnitude rule ("250 W", "65.0 °C", "3.1 %";
//     percentages are not capped: "250 %").
//   * Negatives keep their minus sign, signed or not ("-12.3 MiB"); signed
//     adds "+" to zero and positives ("+1.5 GiB", "+0.0 MiB"). A value that
//     rounds to zero has no minus sign.
// barFraction(v, max)          v / max clamped to [0, 1]; 0 when v is not a
//                              number or max is not a finite positive number.

export const MISSING = "\u2013";
export const UNITS = ["%", "MiB", "s", "B", "B/s", "W", "MHz", "\u00b0C", "CPUs", ""];

const BINARY = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
const BINARY_START = { B: 0, "B/s": 0, MiB: 2 };
const COUNTS = ["", "CPUs"]; // whole numbers without decimals
const EXACT = 2 ** 53; // from here on every double is a whole number

export function isUnknown(x) {
  return typeof x !== "number" || !Number.isFinite(x);
}

// x (>= 0) with `places` decimals, half away from zero on its exact value;
// no exponent form for huge numbers (toFixed switches to it at 1e21).
function fixed(x, places) {
  if (x >= EXACT) return BigInt(x).toString() + (places ? "." + "0".repeat(places) : "");
  return x.toFixed(places);
}

function magnitude(x) {
  const one = fixed(x, 1);
  return Number(one) < 100 ? one : fixed(x, 0);
}

function binary(x, step) {
  while (step < BINARY.length - 1 && Number(fixed(x, 0)) >= 1024) {
    x /= 1024;
    step += 1;
  }
  return `${magnitude(x)} ${BINARY[step]}`;
}

function pad2(n) {
  return n < 10n ? `0${n}` : `${n}`;
}

function duration(x) {
  const two = fixed(x, 2);
  if (Number(two) < 10) return `${two} s`;
  const one = fixed(x, 1);
  if (Number(one) < 60) return `${one} s`;
  const total = BigInt(fixed(x, 0)); // exact, however large
  const hours = total / 3600n;
  const minutes = (total % 3600n) / 60n;
  const seconds = total % 60n;
  return hours > 0n ? `${hours}:${pad2(minutes)}:${pad2(seconds)}` : `${minutes}:${pad2(seconds)}`;
}

function roundsToZero(text) {
  return /^[0.:]+$/.test(text.split(" ", 1)[0]);
}

export function fmt(value, unit, { signed = false } = {}) {
  if (!UNITS.includes(unit)) {
    throw new Error(`unknown unit ${JSON.stringify(unit)}; expected one of ${UNITS.map((u) => JSON.stringify(u)).join(", ")}`);
  }
  if (isUnknown(value)) return MISSING;
  const x = Math.abs(value);
  let text;
  if (unit === "s") text = duration(x);
  else if (unit in BINARY_START) text = binary(x, BINARY_START[unit]) + (unit === "B/s" ? "/s" : "");
  else if (COUNTS.includes(unit) && Number.isInteger(x)) text = fixed(x, 0) + (unit === "" ? "" : ` ${unit}`);
  else text = magnitude(x) + (unit === "" ? "" : ` ${unit}`);
  if (roundsToZero(text)) return signed ? `+${text}` : text;
  return (value < 0 ? "-" : signed ? "+" : "") + text;
}

export function barFraction(value, max) {
  if (typeof value !== "number" || Number.isNaN(value)) return 0;
  if (typeof max !== "number" || !Number.isFinite(max) || max <= 0) return 0;
  const f = value / max;
  return f <= 0 ? 0 : f >= 1 ? 1 : f;
}
