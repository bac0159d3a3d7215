// Display formatters for the nbmon meter. Pure functions, no DOM.
//
// Shared conventions, so that numbers in the meter keep a steady width:
//   * Anything that is not a finite number (NaN, null, undefined, ±Infinity,
//     strings, booleans) is shown as "–" (U+2013 EN DASH). Python sends None
//     for "unknown", which arrives here as null.
//   * Negative readings are never real (memory, load and elapsed time cannot be
//     below zero; -1 is a common "unknown" sentinel), so they also show "–".
//   * Magnitudes below 100 get one decimal, 100 and above are whole numbers;
//     rounding happens before the unit/precision is chosen, so 99.96 becomes
//     "100", never "100.0".
//   * Number and unit are separated by a plain space.
//
// formatBytes(mib)      MiB in. Binary units MiB, GiB, TiB, PiB, EiB; the next
//                       unit is used once the rounded value reaches 1024.
//                       0 -> "0.0 MiB", 512 -> "512 MiB", 1023.6 -> "1.0 GiB",
//                       1536 -> "1.5 GiB", 153600 -> "150 GiB".
// formatPercent(p)      3.14159 -> "3.1 %", 99.96 -> "100 %", 250 -> "250 %".
//                       Not capped: a process using several cores exceeds 100.
// formatDuration(s)     below 10 s two decimals ("0.25 s", "9.99 s"), below
//                       60 s one decimal ("12.3 s"), then a clock rounded to
//                       whole seconds: "m:ss" ("1:15") and from one hour
//                       "h:mm:ss" ("1:02:05"); hours are not wrapped into days.
// barFraction(v, max)   v / max clamped to [0, 1]; 0 when v is not a number or
//                       max is not a finite positive number.

export const MISSING = "\u2013";

const BYTE_UNITS = ["MiB", "GiB", "TiB", "PiB", "EiB"];

function isReading(x) {
  return typeof x === "number" && Number.isFinite(x) && x >= 0;
}

// One decimal below 100, whole numbers from 100 on (after rounding).
// Decides on the rounded text itself so the boundary can't disagree with it.
function magnitude(x) {
  const oneDecimal = x.toFixed(1);
  return Number(oneDecimal) < 100 ? oneDecimal : Math.round(x).toFixed(0);
}

export function formatBytes(mib) {
  if (!isReading(mib)) return MISSING;
  let value = mib;
  let unit = 0;
  while (Math.round(value) >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${magnitude(value)} ${BYTE_UNITS[unit]}`;
}

export function formatPercent(p) {
  if (!isReading(p)) return MISSING;
  return `${magnitude(p)} %`;
}

function pad2(n) {
  return n < 10 ? `0${n}` : `${n}`;
}

export function formatDuration(seconds) {
  if (!isReading(seconds)) return MISSING;
  const twoDecimals = seconds.toFixed(2);
  if (Number(twoDecimals) < 10) return `${twoDecimals} s`;
  const oneDecimal = seconds.toFixed(1);
  if (Number(oneDecimal) < 60) return `${oneDecimal} s`;
  const total = Math.round(seconds);
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  return h > 0 ? `${h}:${pad2(m)}:${pad2(s)}` : `${m}:${pad2(s)}`;
}

export function barFraction(value, max) {
  if (typeof value !== "number" || Number.isNaN(value)) return 0;
  if (typeof max !== "number" || !Number.isFinite(max) || max <= 0) return 0;
  const f = value / max;
  return f <= 0 ? 0 : f >= 1 ? 1 : f;
}
