// Colours that read in any theme: the colours behind a view and of its text,
// and a band label's colour, as muted as it can be and still read
// (contrast >= MIN_CONTRAST).

import { BAND_FILL } from "./bands.js";

const MIN_CONTRAST = 5.0;       // text against what is behind it (WCAG AA asks 4.5)

export function parseColor(text) {
  const m = /rgba?\(([^)]+)\)/.exec(text || "");
  if (m) {
    const [r, g, b, a = 1] = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
    return [r, g, b, a];
  }
  const hex = /^#([0-9a-f]{3}|[0-9a-f]{6})$/i.exec((text || "").trim());
  if (!hex) return null;
  const h = hex[1].length === 3 ? [...hex[1]].map((c) => c + c).join("") : hex[1];
  return [0, 2, 4].map((i) => parseInt(h.slice(i, i + 2), 16)).concat(1);
}

/** ``color`` (with its alpha) over the opaque ``under``. */
export function over(color, under) {
  const a = color[3] ?? 1;
  return [0, 1, 2].map((i) => color[i] * a + under[i] * (1 - a)).concat(1);
}

function luminance([r, g, b]) {
  const lin = (c) => ((c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}

/** WCAG contrast ratio of two opaque colours. */
export function contrast(a, b) {
  const [hi, lo] = [luminance(a), luminance(b)].sort((p, q) => q - p);
  return (hi + 0.05) / (lo + 0.05);
}

/** As muted as ``fg`` can be made towards ``bg`` and still read: contrast >= MIN_CONTRAST. */
export function muted(fg, bg) {
  let best = fg;
  for (let t = 0.05; t <= 0.6; t += 0.05) {
    const mix = [0, 1, 2].map((i) => fg[i] * (1 - t) + bg[i] * t).concat(1);
    if (contrast(mix, bg) < MIN_CONTRAST) break;
    best = mix;
  }
  return best;
}

const css = (c) => `rgb(${c.slice(0, 3).map((v) => Math.round(v)).join(", ")})`;

/** The opaque colour behind ``el``: the first ancestor's that has one, else white. */
function background(el) {
  for (let node = el; node && node.nodeType === 1; node = node.parentElement) {
    const c = parseColor(getComputedStyle(node).backgroundColor);
    if (c && c[3] > 0) return over(c, [255, 255, 255, 1]);
  }
  return [255, 255, 255, 1];
}

export function themeOf(el) {
  const style = getComputedStyle(el);
  const bg = background(el);
  const fg = over(parseColor(style.color) || [34, 34, 34, 1], bg);
  const band = over(BAND_FILL, bg);
  return { bg: css(bg), fg: css(fg), band: css(muted(fg, band)), grid: css(over([128, 128, 128, 0.5], bg)),
    font: style.getPropertyValue("--jp-ui-font-family").trim() || "system-ui, sans-serif" };
}
