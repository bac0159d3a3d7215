// The page's share of its dashboards: one set of watchers for all of them
// (records added, the theme, the tab shown again), the timing of their last
// redraws, and how long new points wait for the next one (redrawWait():
// within DUTY of the page's main thread). PAGE is kept on globalThis, so that
// every dashboard on the page shares it.

// A redraw is a paint (~1 ms of script), a relayout of a y axis whose top
// moved, or where more changed a full Plotly.react (plotly's whole pipeline:
// ~20-30 ms on a 2-core VM, a floor of the figure, not of its points). New
// points wait until the page's redraws (all its dashboards), each to the end of
// its paint (a worker's, or the frame that renders it: afterFrame()), have
// taken at most DUTY of the time, and between REDRAW_MIN_MS and REDRAW_MAX_MS
// (still live). The floor is for what no script sees: each paint costs the
// browser's compositor a few ms more here; a 600 s window on ~800 px moves by
// ~1.3 px a second.
export const DUTY = 0.01;
export const REDRAW_MIN_MS = 2000;
export const REDRAW_MAX_MS = 5000;
const REDRAWS_TIMED = 8;        // the median of the page's last redraws is what one costs

export const PAGE = (globalThis.__nbmonPage ??= { lives: new Map(), started: false, redraws: [], scrolling: 0 });

/**
 * How long new points wait after a view's redraw: ``views`` dashboards on
 * the page, each redraw ``ms`` (the median of the page's last ones) of its
 * main thread, within DUTY of it; REDRAW_MIN_MS before any is timed.
 */
export function redrawWait(ms, views) {
  const wait = Number.isFinite(ms) ? (ms * Math.max(1, views)) / DUTY : 0;
  return Math.min(REDRAW_MAX_MS, Math.max(REDRAW_MIN_MS, wait));
}

export function redrawMs() {
  const sorted = [...PAGE.redraws].sort((a, b) => a - b);
  return sorted.length ? sorted[sorted.length >> 1] : NaN;
}

/**
 * A User Timing measure from ``start`` to now, for the page's profilers (a
 * PerformanceObserver), and not kept (a day of them would be megabytes): its milliseconds.
 */
export function measure(name, start) {
  const ms = performance.now() - start;
  performance.measure(name, { start, duration: ms });
  performance.clearMeasures(name);
  return ms;
}

export function timedRedraw(ms) {
  PAGE.redraws.push(ms);
  if (PAGE.redraws.length > REDRAWS_TIMED) PAGE.redraws.shift();
}

/** The views on the page that draw: ready, in view, in the page. */
export function drawingViews() {
  let n = 0;
  for (const live of PAGE.lives.values()) {
    for (const view of live.views.values()) if (view.ready && view.visible && view.root.isConnected) n += 1;
  }
  return n;
}

export function watchPage() {
  if (PAGE.started) return;
  PAGE.started = true;
  // Records appear (and are re-rendered by the kernel's updates) anywhere in
  // the page: look for them when one is added, never for a plot's own changes.
  new MutationObserver((records) => {
    for (const r of records) {
      for (const node of r.addedNodes) {
        if (node.nodeType === 1 && (node.matches(".nbmon-live-record") || node.querySelector(".nbmon-live-record"))) {
          for (const live of PAGE.lives.values()) live.scan();
          return;
        }
      }
    }
  }).observe(document.body, { childList: true, subtree: true });
  new MutationObserver(() => {
    for (const live of PAGE.lives.values()) live.themeChanged();
  }).observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name"] });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) for (const live of PAGE.lives.values()) live.drawAll();
  });
}
