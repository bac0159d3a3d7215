// The cell bands: the cells in the visible range as bands (neighbours closer
// than MERGE_PX merge), their labels and hover texts, and bands kept as drawn
// while they would move by under half a pixel (steady()).

import { fmt } from "../format.js";

export const MERGE_PX = 6;      // bands closer than this merge, and none is drawn narrower than 1 px
export const BAND_FILL = [128, 128, 128, 0.1];

/**
 * The cell bands to draw between x0 and x1 at ``pxPerS`` pixels a second:
 * clipped to the range, at least 1 px wide, and neighbours closer than
 * MERGE_PX merged while one of them is narrower than MERGE_PX (a thousand
 * quick cells: one band). ``cells`` are sorted by t0; a running cell (t1
 * null) ends at ``end``.
 */
export function bandGroups(cells, x0, x1, pxPerS, end) {
  const groups = [];
  for (const cell of cells) {
    const t1 = cell.t1 ?? end;
    if (t1 < x0 || cell.t0 > x1 || t1 < cell.t0) continue;
    const a = Math.max(cell.t0, x0);
    const b = Math.min(Math.max(t1, a + 1 / pxPerS), x1);
    const last = groups[groups.length - 1];
    const narrow = (b - a) * pxPerS < MERGE_PX;
    if (last && (a - last.b) * pxPerS < MERGE_PX && (narrow || (last.b - last.a) * pxPerS < MERGE_PX)) {
      last.b = Math.max(last.b, b);
      last.cells.push(cell);
    } else {
      groups.push({ a, b, cells: [cell] });
    }
  }
  return groups;
}

function prompt(cell) {
  return `[${cell.n ?? " "}]`;
}

/** A band's label ("[7]", "[12]–[40]") and hover text. */
export function describe(group) {
  const { cells } = group;
  const first = cells[0], last = cells[cells.length - 1];
  if (cells.length === 1) {
    const took = first.t1 == null ? "running" : fmt(first.t1 - first.t0, "s");
    return { label: prompt(first), hover: `In ${prompt(first)} ${first.label || ""} · ${took}` };
  }
  const busy = cells.reduce((sum, c) => sum + ((c.t1 ?? c.t0) - c.t0), 0);
  const label = `${prompt(first)}–${prompt(last)}`;
  return { label, hover: `In ${label} · ${cells.length} cells · ${fmt(busy, "s")}` };
}

/**
 * The cell bands as last drawn where ``shapes`` would move none of them by
 * half a pixel (a window that grows moves a band's 1 px minimum by less),
 * else ``shapes``.
 */
export function steady(shapes, drawn, pxPerS) {
  if (!drawn || drawn.length !== shapes.length) return shapes;
  const near = (a, b) => Math.abs(a - b) * pxPerS < 0.5;
  return shapes.every((s, k) => near(s.x0, drawn[k].x0) && near(s.x1, drawn[k].x1)) ? drawn : shapes;
}
