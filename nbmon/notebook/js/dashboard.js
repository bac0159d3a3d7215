// nbmon live dashboard: the front end of nbmon.notebook.dashboard's FigureWidget.
//
// The kernel's FigureWidget is a plotly FigureWidget whose _esm is this small
// module instead of plotly's 5 MB widget bundle. The bundle (plotly.js and
// plotly's own FigureModel/FigureView) comes from the kernel once per page
// and plotly version (one message, custom, so never part of saved widget
// state) and then used as is, with two changes that make streaming one-way:
//
//   * plotly's view answers every update with _js2py_traceDeltas and
//     _js2py_layoutDelta, echoes of what the kernel has just sent, each one a
//     message to the kernel and two kernel status messages. They are dropped
//     (the kernel never needs them: it knows what it sent). Hover, click,
//     selection, zoom, pan, legend clicks and resizes reach the kernel only
//     where the user's code asked for them (a callback on the widget: the
//     kernel sends the list, "nbmon:events").
//   * New samples do not travel as plotly trait updates (whole arrays, twice
//     per frame) but as one custom message per frame holding only the new
//     points ("nbmon:append": groups of streams that share their x, float64,
//     one float32 y per stream; a group may replace its streams' points; the
//     title; changed cell bands). Nothing is sent back.
//
// The streams (the traces fed with points) and a layout patch (shapes,
// annotations, margins laid over the figure's) are in the widget's state,
// "_nbmon": a stream is one of the figure's traces ({id, unit, index}) or
// one this module adds ({id, unit, trace}: a Dask worker that joined). The
// kernel re-sends them when they change (rare: joins, leaves, a warning).
//
// The cost of a view stays flat whatever the chart's age and the cells run:
//   * the points of the window are held per trace (Series: bounded, older
//     points merged into min/max pairs past MAX_HELD), hover texts formatted
//     once, as points arrive;
//   * a redraw draws at most one point per pixel of the plot's width: the
//     lowest and highest of every two-pixel column (decimate(): a one-sample
//     spike keeps its sample), only the visible range;
//   * cell bands only inside the visible range, and neighbours closer than
//     MERGE_PX merged into one band (bandGroups()), labelled where the label
//     does not run into the next band's;
//   * the lines, the cell bands, their labels, the x axes' grid and tick
//     labels and the title are painted on a canvas over the plot (paint()),
//     by a worker where the browser has OffscreenCanvas (Painter): a redraw
//     then changes nothing in the page, and the page renders no frame for it
//     (in a long notebook each frame of the page's costs the browser more:
//     ~30 ms of CPU after 1,000 cells); plotly draws the rest (the y axes,
//     legend, the kernel's marks) and holds one empty point per stream.
//     Plotly's x axes never move while the window scrolls: a relayout of
//     them (axes, then the whole plot measured and rastered) cost the page
//     ~60 ms of CPU per redraw, where the paint costs ~1 ms; they are brought
//     to the painted range only when the user presses a button on the chart
//     (press(): plotly's zoom and pan start from them). A new y peak is a
//     relayout of that axis; plotly's whole pipeline (Plotly.react, ~30 ms)
//     runs only when anything else changes (frameKey()): the theme, the size,
//     the kernel's edits, the legend. The hover is a box of our own (plotly's
//     would need its traces' points). Where the user's code asks for plotly's
//     events (they carry the points), plotly holds and draws the points, the
//     bands and its x axes itself, at its own cost;
//   * nothing is redrawn unless something would move by a pixel (the x range,
//     a point, a band, the theme, the size: signature()), and new points only
//     as often as keeps the page's redraws, timed to the end of the frame
//     that renders them, within DUTY of its main thread (redrawWait(): every
//     2 s for one dashboard here, later for many or in a long notebook);
//     bands keep the ends they were drawn with while those move by under half
//     a pixel (steady()); plotly is given the chart's width, so that
//     it never measures the page (a layout of all of it) to draw, and every
//     axis's range (ranges()), so that it computes none (a sixth of a redraw);
//   * one observer, one theme watcher and one visibility listener per page,
//     for every dashboard in it; every listener is removed with its view.
//
// Where it shows: the kernel displays a static record (a text/html table with
// data-nbmon-live="<id>", then its timeline as an image/png output), and no
// widget view. When this model lives in the page it mounts a plotly view
// into that record and hides the static table and picture; when it does not
// (kernel gone, nbconvert, GitHub, a saved notebook reopened) the record is
// all there is, and it shows the figures. The kernel re-sends the record now
// and then to keep it current; the view is moved into the new copy, not
// redrawn. Displaying the widget itself (display(dashboard.widget)) also
// works: render() below.
//
// What a view drew is on its element as __nbmonDrawn ({traces: [{meta, name,
// x, y}], bands: [hover text], x: {range, bands: [[a, b]], ticks: [text]},
// labels and title: [{text, box: [x, y, w, h], color}]}), its canvas's pixels
// from __nbmonPixels() (a promise: a worker's canvas is not the page's to
// read), and each redraw is two User Timing measures: "nbmon-redraw" its
// script, "nbmon-frame" to the end of its paint (the worker's, or the frame
// that renders it). The page's tests and benchmarks read them.
//
// nbmon/notebook/frontend.py joins it and format.js into the one module anywidget loads.

import { fmt } from "./format.js";

const STYLE_ID = "nbmon-live-style-4";
const CSS = `
.nbmon-live-record.nbmon-live-mounted > .nbmon-live-static { display: none; }
.jp-OutputArea-child:has(.nbmon-live-record.nbmon-live-mounted) + .jp-OutputArea-child:has(.jp-RenderedImage) {
  display: none;
}
/* Its height set where it is drawn: a redraw lays out the chart, not the notebook around it. */
.nbmon-live-view { width: 100%; min-width: 0; contain: strict; position: relative; }
.nbmon-live-view > .nbmon-lines { position: absolute; left: 0; top: 0; pointer-events: none; }
.nbmon-live-view > .nbmon-hover {
  display: none; position: absolute; pointer-events: none; z-index: 1001; padding: 3px 6px;
  font: 11px var(--jp-ui-font-family, system-ui, sans-serif); box-sizing: border-box;
  border: 1px solid; border-radius: 3px;
}
.nbmon-live-view > .nbmon-hover > .nbmon-hover-head { font-weight: 600; }
.nbmon-hover-swatch { display: inline-block; width: 10px; height: 3px; margin: 0 5px 3px 0; vertical-align: middle; }
.nbmon-live-view > .nbmon-hover-line { display: none; position: absolute; width: 1px; pointer-events: none; z-index: 1000; }
.nbmon-live-record.nbmon-live-stale > .nbmon-live-view { filter: grayscale(1); opacity: 0.75; }  /* texts still read */
.nbmon-live-note {
  font: 12px var(--jp-ui-font-family, system-ui, sans-serif);
  color: var(--jp-ui-font-color1, #222);
  border-left: 3px solid var(--jp-warn-color0, #b26b00);
  padding-left: 6px;
  margin: 2px 0 4px;
}
`;

export const MAX_HELD = 20000;  // points held per trace; past it, the oldest half merges into min/max pairs
const BUCKET_PX = 2;            // a redraw's column width: its lowest and highest point
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
const HEADROOM = 1.05;           // a y axis's top above its highest point (plotly's own autorange margin)...
const TOP_STEPS = [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10];   // ...rounded up to one of these times 10^n
export const MERGE_PX = 6;      // bands closer than this merge, and none is drawn narrower than 1 px
const LABEL_PX_PER_CHAR = 6.5;  // a band label's width at 10 px, to show only labels that fit
const LABEL_FONT_PX = 10;       // a band label's font, in the UI's family
const LABEL_BOX_PX = 14;        // ...in a strip this high along the plot's top edge
const MIN_CONTRAST = 5.0;       // text against what is behind it (WCAG AA asks 4.5)
const RUNNING_S = 1e6;          // a running cell's band: past any window's end, clipped by plotly
export const X_TICK_PX = 80;    // plotly's spacing of x ticks: one per 80 px at most, 5 to 10 of them
const TICK_PAD_PX = 4;          // an x tick label's top below its plot
const X_TITLE_STANDOFF_PX = 34; // the x title below the painted tick labels, where plotly's own put it
const DASHES = { dot: [1, 2], dash: [4, 2], longdash: [8, 2], dashdot: [4, 2, 1, 2], longdashdot: [8, 2, 1, 2] };  // x line width
const SIZE_KEYS = new Set(["width", "height", "autosize"]);
// Plotly's "reset axes" and double click would go back to the first ranges
// drawn; "autoscale" and a double click that autoscales follow the window again.
const MODEBAR_REMOVE = ["toImage", "sendChartToCloud", "select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "resetScale2d",
  "hoverClosestCartesian", "hoverCompareCartesian", "toggleSpikelines"];
const MODEBAR_PX = 4 * 28;      // what is left of it: zoom, pan, autoscale, download
const TITLE_PX = 24;            // a title line (14 px font)
const LEGEND_PX = 20;           // a legend line, before plotly has drawn one
// Bundles of the page, shared by its dashboards: version -> {promise, done, asked}.
const BUNDLES = (globalThis.__nbmonPlotlyBundles ??= new Map());

// -- one set of page-wide watchers for every dashboard ----------------------------

const PAGE = (globalThis.__nbmonPage ??= { lives: new Map(), started: false, redraws: [], scrolling: 0 });

/**
 * How long new points wait after a view's redraw: ``views`` dashboards on
 * the page, each redraw ``ms`` (the median of the page's last ones) of its
 * main thread, within DUTY of it; REDRAW_MIN_MS before any is timed.
 */
export function redrawWait(ms, views) {
  const wait = Number.isFinite(ms) ? (ms * Math.max(1, views)) / DUTY : 0;
  return Math.min(REDRAW_MAX_MS, Math.max(REDRAW_MIN_MS, wait));
}

function redrawMs() {
  const sorted = [...PAGE.redraws].sort((a, b) => a - b);
  return sorted.length ? sorted[sorted.length >> 1] : NaN;
}

/**
 * A User Timing measure from ``start`` to now, for the page's profilers (a
 * PerformanceObserver), and not kept (a day of them would be megabytes): its milliseconds.
 */
function measure(name, start) {
  const ms = performance.now() - start;
  performance.measure(name, { start, duration: ms });
  performance.clearMeasures(name);
  return ms;
}

/**
 * ``done`` once the page has rendered the current animation frame: a message
 * posted from a requestAnimationFrame callback is delivered as the next task,
 * after that frame's style, layout and paint (what a redraw costs the page's
 * main thread beyond its script; raster and compositing run on other threads).
 */
function afterFrame(done) {
  const { port1, port2 } = new MessageChannel();
  port1.onmessage = () => {
    port1.close();
    done();
  };
  port2.postMessage(null);
}

// -- painting ----------------------------------------------------------------------
// A view paints a scene (Live.paint()): plain data, in the canvas's pixels,
// that paintScene() draws on a 2D context. Where the browser has
// OffscreenCanvas it is drawn by a worker of the view's own, straight to the
// compositor: the page's main thread then does no frame for a redraw (in a
// 1,000-cell JupyterLab page a main-thread frame, even one that changes
// only a canvas, costs the browser ~30 ms of CPU in commits, intersection
// observers and hit tests; a worker's ~5 ms). Elsewhere it is drawn on the
// page's thread.

/**
 * Draw ``scene`` on ``ctx``, the canvas sized to it: the filled rects, the
 * grid lines, each line (its points as x, y pixel pairs, clipped to its
 * subplot, filled down to ``base`` where it has a fill), then the texts
 * (clipped where they have a clip). Self-contained: a worker runs its source.
 */
export function paintScene(ctx, scene) {
  const { w, h, ratio } = scene, canvas = ctx.canvas;
  if (canvas.width !== Math.round(w * ratio) || canvas.height !== Math.round(h * ratio)) {
    canvas.width = Math.round(w * ratio);
    canvas.height = Math.round(h * ratio);
  }
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  for (const [x, y, rw, rh, color] of scene.rects) {
    ctx.fillStyle = color;
    ctx.fillRect(x, y, rw, rh);
  }
  ctx.setLineDash([]);
  for (const grid of scene.grids) {
    ctx.beginPath();
    for (const x of grid.xs) {
      ctx.moveTo(x, grid.top);
      ctx.lineTo(x, grid.bottom);
    }
    ctx.strokeStyle = grid.color;
    ctx.lineWidth = grid.width;
    ctx.stroke();
  }
  for (const line of scene.lines) {
    const { xy } = line;
    if (!xy.length) continue;
    ctx.save();
    ctx.beginPath();
    ctx.rect(...line.clip);
    ctx.clip();
    ctx.beginPath();
    ctx.moveTo(xy[0], xy[1]);
    for (let i = 2; i < xy.length; i += 2) ctx.lineTo(xy[i], xy[i + 1]);
    if (line.fill) {
      ctx.save();
      ctx.lineTo(xy[xy.length - 2], line.base);
      ctx.lineTo(xy[0], line.base);
      ctx.closePath();
      ctx.fillStyle = line.fill;
      ctx.fill();
      ctx.restore();
    }
    if (line.width > 0) {
      ctx.lineWidth = line.width;
      ctx.lineJoin = "round";
      ctx.strokeStyle = line.color;
      ctx.setLineDash(line.dash);
      ctx.stroke();
    }
    ctx.restore();
  }
  ctx.textBaseline = "top";
  for (const text of scene.texts) {
    ctx.save();
    if (text.clip) {
      ctx.beginPath();
      ctx.rect(...text.clip);
      ctx.clip();
    }
    ctx.font = text.font;
    ctx.fillStyle = text.color;
    ctx.textAlign = text.align || "left";
    ctx.fillText(text.text, text.x, text.y);
    ctx.restore();
  }
}

// The worker: a scene in, painted, and its id back; or the canvas's pixels on request.
const PAINTER_SOURCE = `const paintScene = ${paintScene};
let ctx;
onmessage = ({ data }) => {
  if (data.canvas) ctx = data.canvas.getContext("2d");
  if (data.scene) paintScene(ctx, data.scene);
  if (data.pixels) {
    const { width, height } = ctx.canvas;
    const pixels = ctx.getImageData(0, 0, width, height).data;
    postMessage({ id: data.id, width, height, pixels }, [pixels.buffer]);
  } else if (data.id) postMessage({ id: data.id });
};`;

/**
 * A view's canvas over its plot, and what paints it: a worker where the
 * browser can hand it one, else the page's thread. At most one scene waits
 * while one is painted (the newest: a pan asks at every step).
 */
class Painter {
  constructor(root) {
    this.root = root;
    this.canvas = Object.assign(document.createElement("canvas"), { className: "nbmon-lines" });
    this.size = "";
    this.calls = new Map();   // id -> what to call when the worker answers
    this.ids = 0;
    this.busy = false;
    this.next = null;         // {scene, done: [callbacks]} waiting for the worker
    if (typeof OffscreenCanvas === "function" && this.canvas.transferControlToOffscreen) {
      try {
        this.url = URL.createObjectURL(new Blob([PAINTER_SOURCE], { type: "text/javascript" }));
        this.worker = new Worker(this.url);
        const offscreen = this.canvas.transferControlToOffscreen();
        this.worker.postMessage({ canvas: offscreen }, [offscreen]);
        this.worker.onmessage = ({ data }) => {
          const call = this.calls.get(data.id);
          this.calls.delete(data.id);
          call?.(data);
        };
      } catch {   // a page whose policy forbids workers from blob: URLs
        this.worker?.terminate();
        this.worker = null;
        URL.revokeObjectURL(this.url);
      }
    }
    if (!this.worker) this.ctx = this.canvas.getContext("2d");
  }

  /** Paint ``scene``; ``done`` (optional) once it is on screen. */
  paint(scene, done) {
    if (this.canvas.parentNode !== this.root) this.root.appendChild(this.canvas);
    const size = `${scene.w}x${scene.h}`;
    if (size !== this.size) {   // the only change to the page: a new size
      this.size = size;
      Object.assign(this.canvas.style, { width: `${scene.w}px`, height: `${scene.h}px` });
    }
    if (!this.worker) {
      paintScene(this.ctx, scene);
      if (done) requestAnimationFrame(() => afterFrame(done));
      return;
    }
    const waiting = this.next?.done || [];
    this.next = { scene, done: done ? [...waiting, done] : waiting };
    if (!this.busy) this.send();
  }

  send() {
    const { scene, done } = this.next;
    this.next = null;
    this.busy = true;
    const id = ++this.ids;
    this.calls.set(id, () => {
      this.busy = false;
      for (const call of done) call();
      if (this.next) this.send();
    });
    this.worker.postMessage({ scene, id }, scene.lines.map((line) => line.xy.buffer));
  }

  /** What is on the canvas now: {width, height, pixels} (RGBA, unpremultiplied). */
  pixels() {
    if (!this.worker) {
      const { width, height } = this.canvas;
      return Promise.resolve({ width, height, pixels: this.ctx.getImageData(0, 0, width, height).data });
    }
    return new Promise((resolve) => {
      const id = ++this.ids;
      this.calls.set(id, resolve);
      this.worker.postMessage({ pixels: true, id });
    });
  }

  remove() {
    this.worker?.terminate();
    if (this.url) URL.revokeObjectURL(this.url);
    this.calls.clear();
    this.canvas.remove();
  }
}

function timedRedraw(ms) {
  PAGE.redraws.push(ms);
  if (PAGE.redraws.length > REDRAWS_TIMED) PAGE.redraws.shift();
}

/** The views on the page that draw: ready, in view, in the page. */
function drawingViews() {
  let n = 0;
  for (const live of PAGE.lives.values()) {
    for (const view of live.views.values()) if (view.ready && view.visible && view.root.isConnected) n += 1;
  }
  return n;
}

function watchPage() {
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

function installStyle() {
  if (document.getElementById(STYLE_ID)) return;
  const style = document.createElement("style");
  style.id = STYLE_ID;
  style.textContent = CSS;
  document.head.appendChild(style);
}

// The kernel pushes plotly's bundle once per process: through a carrier
// model (its "_nbmon" says carrier: true, nothing else) as %resmon starts, so
// that the page imports it while the kernel builds the chart, or else through
// its first dashboard's model; a page that missed it (reloaded, a second tab)
// asks a dashboard for it after ASK_AFTER_MS. Asking needs the kernel's main
// thread, which a running cell holds: a push does not.
const ASK_AFTER_MS = 3000;

function loadBundle(model, ask = true) {
  const version = model.get("_nbmon").bundle;
  if (!BUNDLES.has(version)) {
    const entry = { done: false, asked: false };
    entry.promise = new Promise((resolve, reject) => Object.assign(entry, { resolve, reject }));
    BUNDLES.set(version, entry);
  }
  const entry = BUNDLES.get(version);
  if (entry.done) return entry.promise;
  const onMessage = (msg, buffers) => {
    if (!msg || msg.type !== "nbmon:bundle" || entry.done) return;
    entry.done = true;
    importBundle(buffers[0]).then(entry.resolve, entry.reject);
  };
  model.on("msg:custom", onMessage);
  entry.promise.finally(() => model.off("msg:custom", onMessage));
  if (ask) setTimeout(() => {
    if (entry.done || entry.asked) return;
    entry.asked = true;
    model.send({ type: "nbmon:bundle" });
  }, ASK_AFTER_MS);
  return entry.promise;
}

// plotly's view methods that send a user's action to the kernel, and the
// event a callback in the kernel asks for to receive it.
const FORWARDED = {
  handle_plotly_hover: "hover", handle_plotly_unhover: "unhover", handle_plotly_click: "click",
  handle_plotly_selected: "select", handle_plotly_deselect: "deselect", handle_plotly_restyle: "restyle",
};

async function importBundle(bytes) {
  const url = URL.createObjectURL(new Blob([bytes], { type: "text/javascript" }));
  try {
    const mod = await import(url);
    const view = mod.FigureView.prototype;
    // The echoes described at the top; the module is ours alone (a private
    // copy), so plotly's own FigureWidgets keep theirs.
    view._sendTraceDeltas = () => {};
    view._sendLayoutDelta = () => {};
    const asked = (self, kind) => PAGE.lives.get(self.model.get("_nbmon")?.id)?.events.has(kind);
    for (const [method, kind] of Object.entries(FORWARDED)) {
      const original = view[method];
      view[method] = function (event) {
        if (asked(this, kind)) original.call(this, event);
      };
    }
    const relayout = view.handle_plotly_relayout;
    view.handle_plotly_relayout = function (change) {
      // A new size follows the page, and a scroll the window, not the user: never a message for them.
      if (PAGE.scrolling || !asked(this, "relayout") || (change && Object.keys(change).every((k) => SIZE_KEYS.has(k)))) return;
      relayout.call(this, change);
    };
    const update = view.handle_plotly_update;
    view.handle_plotly_update = function (change) {
      if (asked(this, "relayout") || asked(this, "restyle")) update.call(this, change);
    };
    return { mod, Plotly: globalThis.Plotly };
  } finally {
    URL.revokeObjectURL(url);
  }
}

// -- arrays as plotly's serializer ships them: {dtype, shape, value} --------

const TYPED = { float32: Float32Array, float64: Float64Array, int32: Int32Array, uint32: Uint32Array };

export function typed(value) {
  if (value == null) return new Float64Array(0);
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) return value;
  if (Array.isArray(value)) return Float64Array.from(value, (v) => (v == null ? NaN : v));
  const Type = TYPED[value.dtype] || Float64Array;
  const buf = value.value ?? value.buffer;
  const view = ArrayBuffer.isView(buf) ? buf : new DataView(buf);
  return new Type(view.buffer, view.byteOffset, view.byteLength / Type.BYTES_PER_ELEMENT);
}

function bufferOf(dataView, Type) {
  return new Type(dataView.buffer.slice(dataView.byteOffset, dataView.byteOffset + dataView.byteLength));
}

// -- what a view holds and draws -------------------------------------------------

/** The points of one trace in the window, with their hover texts. */
export class Series {
  constructor(unit, capacity = MAX_HELD) {
    this.unit = unit;
    this.capacity = capacity;
    this.x = new Float64Array(capacity);
    this.y = new Float32Array(capacity);
    this.text = new Array(capacity);
    this.start = 0;
    this.end = 0;
  }

  get length() {
    return this.end - this.start;
  }

  get first() {
    return this.length ? this.x[this.start] : NaN;
  }

  get last() {
    return this.length ? this.x[this.end - 1] : NaN;
  }

  /** Append points (x ascending), formatting each one's hover text once. */
  push(xs, ys) {
    for (let i = 0; i < xs.length; i++) {
      if (this.end === this.capacity) this.makeRoom();
      this.x[this.end] = xs[i];
      this.y[this.end] = ys[i];
      this.text[this.end] = fmt(ys[i], this.unit);
      this.end += 1;
    }
  }

  clear() {
    this.start = this.end = 0;
  }

  /** Drop the points before ``x`` (the oldest one that the window shows stays first). */
  trim(x) {
    while (this.start < this.end - 1 && this.x[this.start] < x) this.start += 1;
  }

  makeRoom() {
    if (this.length >= this.capacity / 2) {
      // Full: the older half becomes one min/max pair per four points (every extreme stays).
      const half = this.start + (this.length >> 1);
      let w = this.start;   // never ahead of what is read: two written per four read
      for (let i = this.start; i < half; i += 4) {
        let lo = i, hi = i;
        for (let j = i + 1; j < Math.min(i + 4, half); j++) {
          if (this.y[j] < this.y[lo]) lo = j;
          if (this.y[j] > this.y[hi]) hi = j;
        }
        const [a, b] = lo <= hi ? [lo, hi] : [hi, lo];
        this.copy(a, w++);
        if (b !== a) this.copy(b, w++);
      }
      this.move(half, this.end, w);
      this.end = w + (this.end - half);
    }
    this.move(this.start, this.end, 0);
    this.end -= this.start;
    this.start = 0;
  }

  copy(from, to) {
    this.x[to] = this.x[from];
    this.y[to] = this.y[from];
    this.text[to] = this.text[from];
  }

  move(from, to, at) {
    if (from === at) return;
    this.x.copyWithin(at, from, to);
    this.y.copyWithin(at, from, to);
    for (let i = 0; i < to - from; i++) this.text[at + i] = this.text[from + i];
  }

  /** Index of the first point with x >= t (binary search). */
  index(t) {
    let lo = this.start, hi = this.end;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.x[mid] < t) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}

/**
 * The points of ``series`` between x0 and x1 to draw on ``columns`` columns:
 * all of them when they are fewer than two per column, else each column's
 * lowest and highest point, in time order (NaN skipped). ``edges`` adds the
 * point just outside each end, so that a line reaches a range fixed by a zoom.
 */
export function decimate(series, x0, x1, columns, edges = false) {
  let from = series.index(x0);
  let to = series.index(x1);
  while (to < series.end && series.x[to] <= x1) to += 1;
  if (edges) {
    from = Math.max(series.start, from - 1);
    to = Math.min(series.end, to + 1);
  }
  const pick = [];
  if (to - from <= 2 * columns) {
    for (let i = from; i < to; i++) pick.push(i);
  } else {
    const scale = columns / (x1 - x0 || 1);
    let column = -1, lo = -1, hi = -1;
    const flush = () => {
      if (lo < 0) return;
      if (lo === hi) pick.push(lo);
      else pick.push(Math.min(lo, hi), Math.max(lo, hi));
    };
    for (let i = from; i < to; i++) {
      const c = Math.floor((series.x[i] - x0) * scale);
      if (c !== column) {
        flush();
        column = c;
        lo = hi = -1;
      }
      const v = series.y[i];
      if (Number.isNaN(v)) continue;
      if (lo < 0 || v < series.y[lo]) lo = i;
      if (hi < 0 || v > series.y[hi]) hi = i;
    }
    flush();
  }
  const x = new Float64Array(pick.length);
  const y = new Float32Array(pick.length);
  const text = new Array(pick.length);
  pick.forEach((i, k) => {
    x[k] = series.x[i];
    y[k] = series.y[i];
    text[k] = series.text[i];
  });
  return { x, y, text };
}

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

// -- colours that read in any theme ----------------------------------------------

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

const BAND_FILL = [128, 128, 128, 0.1];

function themeOf(el) {
  const style = getComputedStyle(el);
  const bg = background(el);
  const fg = over(parseColor(style.color) || [34, 34, 34, 1], bg);
  const band = over(BAND_FILL, bg);
  return { bg: css(bg), fg: css(fg), band: css(muted(fg, band)), grid: css(over([128, 128, 128, 0.5], bg)),
    font: style.getPropertyValue("--jp-ui-font-family").trim() || "system-ui, sans-serif" };
}

// -- the live model -------------------------------------------------------------

class Live {
  constructor(model) {
    this.model = model;
    this.nbmon = model.get("_nbmon");
    this.id = this.nbmon.id;
    this.views = new Map(); // root element -> view
    this.cells = new Map(); // cell id -> {n, label, t0, t1}
    this.events = new Set(this.nbmon.events || []);
    this.stopped = false;
    this.disposed = false;
    this.onMessage = (msg, buffers) => this.message(msg, buffers);
    model.on("msg:custom", this.onMessage);
    this.edits = 0;   // changes the kernel made to the figure (update_layout, ...): a redraw shows them
    this.onEdit = () => {
      this.edits += 1;
      this.drawAll();
    };
    model.on("change", this.onEdit);
    this.onDeclared = () => {
      this.nbmon = model.get("_nbmon");
      if (this.series) this.declare(this.nbmon.streams);
    };
    model.on("change:_nbmon", this.onDeclared);
    for (const cell of this.nbmon.cells || []) this.cells.set(cell.id, cell);
    this.sortCells();
    this.ready = loadBundle(model).then(({ mod, Plotly }) => {
      if (this.disposed) return;
      this.Plotly = Plotly;
      this.plotly = mod.default();
      this.plotly.initialize({ model });
      this.scan();
    });
    // No frame for a while: the kernel is gone, restarting, or holds the GIL in C code.
    this.heard = performance.now();
    this.watch = setInterval(() => this.markStale(performance.now() - this.heard > this.nbmon.stale_s * 1000), 1000);
    PAGE.lives.set(this.id, this);
    watchPage();
  }

  /**
   * The widget's first state, once it is in the model, into Series; the
   * model keeps empty arrays (a later view starts from ours). False before.
   */
  taken() {
    if (this.series) return true;
    const data = this.model.get("_widget_data");
    if (!this.nbmon.streams.every((stream) => stream.trace || data?.[stream.index])) return false;
    this.series = new Map();
    this.declare(this.nbmon.streams, data);
    return true;
  }

  /**
   * The streams as now declared: a Series each (one kept where its id was
   * declared before, new ones from their trace's points), in order.
   */
  declare(streams, data = this.model.get("_widget_data")) {
    const series = new Map();
    for (const stream of streams) {
      let s = this.series.get(stream.id);
      if (!s) {
        s = new Series(stream.unit);
        const source = stream.trace ?? data[stream.index];
        s.push(typed(source.x), typed(source.y));
        if (!stream.trace) Object.assign(source, { x: [], y: [], text: [] });
      }
      s.stream = stream;
      s.axis = (stream.trace ?? data[stream.index])?.yaxis || "y";
      series.set(stream.id, s);
    }
    this.series = series;
    this.drawAll();
  }

  get last() {
    let last = -Infinity;
    for (const s of this.series.values()) if (s.length && s.last > last) last = s.last;
    return last;
  }

  get first() {
    let first = Infinity;
    for (const s of this.series.values()) if (s.length && s.first < first) first = s.first;
    return first;
  }

  sortCells() {
    this.sorted = [...this.cells.values()].sort((a, b) => a.t0 - b.t0);
  }

  markStale(stale) {
    for (const view of this.views.values()) {
      const record = view.record;
      if (!record) continue;
      record.classList.toggle("nbmon-live-stale", stale);
      if (!stale) {
        disconnected(record, null);
      } else if (!record.querySelector(NOTE)) {   // keeps the time the silence began
        disconnected(record, `nbmon: no data from the kernel since ${new Date().toLocaleTimeString()} ` +
          "(disconnected, restarting, or busy in code that holds the GIL); the chart is not live");
      }
    }
  }

  scan() {
    if (!this.plotly || this.disposed) return;
    for (const record of document.querySelectorAll(`.nbmon-live-record[data-nbmon-live="${this.id}"]`)) {
      if (record.querySelector(":scope > .nbmon-live-view")) continue;
      // A record re-rendered by the kernel's update: move the view, do not redraw.
      const moved = [...this.views.values()].find((v) => v.record && !v.root.isConnected);
      const view = moved || this.addView(document.createElement("div"));
      view.root.classList.add("nbmon-live-view");
      view.record = record;
      record.prepend(view.root);
      record.classList.add("nbmon-live-mounted");
      record.querySelector(":scope > .nbmon-live-note")?.remove();
    }
    // A view whose record left the page for good (its output cleared) goes too.
    for (const view of [...this.views.values()]) {
      if (view.record && !view.root.isConnected && !document.contains(view.record)) {
        const again = document.querySelector(`.nbmon-live-record[data-nbmon-live="${this.id}"]`);
        if (!again) this.removeView(view);
      }
    }
  }

  addView(root) {
    const view = { root, ready: false, visible: true, stale: false, record: null, zoom: null, sig: null };
    this.views.set(root, view);
    view.rendered = (event) => {
      if (event.detail.element !== root) return;
      document.removeEventListener("plotlywidget-after-render", view.rendered);
      view.ready = true;
      // The user's zoom or pan: draw that range; a double click (autorange)
      // follows the live window (x) and the points (y) again.
      root.on("plotly_relayout", (change) => {
        const zoomed = !PAGE.scrolling && userRanges(change);
        if (!zoomed) return;
        for (const [key, range] of Object.entries(zoomed)) {
          if (!range) view.autoscaled = (view.autoscaled || 0) + 1;
          if (key.startsWith("x")) view.zoom = range;
          else if (range) (view.yzoom ??= {})[key] = range;
          else if (view.yzoom) delete view.yzoom[key];
        }
        this.schedule(view, true);
      });
      // A pan moves plotly's axes at every step, and a legend click hides a trace: the lines follow.
      root.on("plotly_relayouting", () => this.paint(view));
      root.on("plotly_restyle", () => this.paint(view));
      this.themeChanged(view);
    };
    view.tip = Object.assign(document.createElement("div"), { className: "nbmon-hover" });
    view.cursor = Object.assign(document.createElement("div"), { className: "nbmon-hover-line" });
    root.append(view.tip, view.cursor);
    view.onPointer = (event) => {
      view.pointer = event.type === "mouseleave" ? null : event;
      view.hoverFrame ||= requestAnimationFrame(() => {
        view.hoverFrame = 0;
        this.hover(view);
      });
    };
    for (const type of ["mousemove", "mousedown", "mouseleave"]) root.addEventListener(type, view.onPointer);
    view.onPress = () => this.press(view);
    view.onRelease = () => {
      view.held = false;
      this.schedule(view, true);
    };
    root.addEventListener("pointerdown", view.onPress, true);   // before plotly's mousedown
    // Plotly's own button would draw the figure again from its traces, which hold no points.
    view.download = {
      name: "nbmon-download", title: "Download plot as a PNG", icon: this.Plotly.Icons.camera,
      click: () => this.Plotly.downloadImage({
        data: this.data(view, view.points, view.groups, root.layout, false),
        layout: this.imageLayout(view),
      }, { format: "png", filename: "nbmon", width: root._fullLayout.width, height: root._fullLayout.height }),
    };
    document.addEventListener("plotlywidget-after-render", view.rendered);
    view.remove = this.plotly.render({ model: this.model, el: root });
    view.io = new IntersectionObserver((entries) => {
      view.visible = entries[entries.length - 1].isIntersecting;
      if (view.visible && view.stale) this.schedule(view, true);
    });
    view.io.observe(root);
    // The chart's width, read here and given to plotly: with autosize it
    // would measure its container at every redraw, a layout of the whole page.
    view.width = 0;
    view.ro = new ResizeObserver(() => {
      if (!root.isConnected || root.clientWidth === view.width) return;
      view.width = root.clientWidth;
      this.schedule(view, true);
    });
    view.ro.observe(root);
    return view;
  }

  removeView(view) {
    document.removeEventListener("plotlywidget-after-render", view.rendered);
    view.io.disconnect();
    view.ro.disconnect();
    clearTimeout(view.frame);
    cancelAnimationFrame(view.hoverFrame);
    for (const type of ["mousemove", "mousedown", "mouseleave"]) view.root.removeEventListener(type, view.onPointer);
    view.root.removeEventListener("pointerdown", view.onPress, true);
    window.removeEventListener("pointerup", view.onRelease, true);
    view.tip.remove();
    view.cursor.remove();
    view.painter?.remove();
    clearTimeout(view.timer);
    view.remove();
    if (view.record) view.root.remove();
    this.views.delete(view.root);
  }

  message(msg, buffers) {
    if (!msg) return;
    if (msg.type === "nbmon:stopped") this.stopped = true;
    if (msg.type === "nbmon:events") this.events = new Set(msg.events);
    if (msg.type !== "nbmon:append" || !this.taken()) return;
    this.heard = performance.now();
    let at = 0;
    for (const group of msg.groups || []) {
      const x = bufferOf(buffers[at++], Float64Array);
      for (const id of group.ids) {
        const y = bufferOf(buffers[at++], Float32Array);
        const series = this.series.get(id);   // a stream since undeclared: its points go
        if (!series) continue;
        if (group.replace) series.clear();
        series.push(x, y);
      }
    }
    const oldest = this.last - this.nbmon.window;
    for (const series of this.series.values()) series.trim(oldest);
    if (msg.title != null) this.title = msg.title;
    if (msg.cells?.length) {
      for (const cell of msg.cells) this.cells.set(cell.id, cell);
      for (const [id, cell] of this.cells) if (cell.t1 != null && cell.t1 < oldest) this.cells.delete(id);
      this.sortCells();
    }
    this.drawAll();
  }

  themeChanged(only) {
    for (const view of only ? [only] : this.views.values()) {
      if (!view.ready) continue;
      view.theme = themeOf(view.record || view.root);
      this.schedule(view, true);
    }
  }

  drawAll() {
    for (const view of this.views.values()) this.schedule(view);
  }

  /**
   * Draw in a task of its own (none while the tab is hidden: draw()), once
   * however often asked, not at an animation frame: asking for one is a
   * frame of the page's to render, which a worker's paint does not need;
   * new points once redrawWait() has passed (``now``: what the user did,
   * the size, the theme: at once).
   */
  schedule(view, now = false) {
    if (!view.ready || this.disposed) return;
    const wait = now ? 0 : (view.drawnAt || 0) + redrawWait(redrawMs(), drawingViews()) - performance.now();
    if (wait > 0) {
      view.timer ||= setTimeout(() => {
        view.timer = 0;
        this.schedule(view, true);
      }, wait);
      return;
    }
    view.frame ||= setTimeout(() => {
      view.frame = 0;
      this.draw(view);
    });
  }

  /**
   * A button pressed on the chart, before plotly's zoom or pan sees it:
   * plotly's x axes (which stay where the last react left them while the
   * window scrolls) to the painted range, and no redraw until it is released.
   */
  press(view) {
    const full = view.root._fullLayout;
    if (!full || !view.drawn || this.events.size) return;
    const [a, b] = this.xRange(view);
    view.held = true;
    window.addEventListener("pointerup", view.onRelease, { capture: true, once: true });
    const moved = {};
    for (const key of xKeys(full)) if (full[key].range[0] !== a || full[key].range[1] !== b) moved[`${key}.range`] = [a, b];
    this.moveAxes(view, moved);
  }

  /**
   * The x range the chart shows: the painted one, or plotly's while a button
   * is held (a pan moves it) or where plotly draws the x axes (the user's events).
   */
  xRange(view) {
    const d = view.drawn;
    return !this.events.size && !view.held && d ? [d.x0, d.x1] : view.root._fullLayout.xaxis.range;
  }

  /** Data to pixels on plotly's x axis ``xa`` at the range the chart shows. */
  xScale(view, xa) {
    return scale({ range: this.xRange(view), _offset: xa._offset, _length: xa._length }, false);
  }

  /** The x range to draw: the user's zoom, else the window up to the newest point. */
  range(view, px) {
    if (view.zoom) return { x0: +view.zoom[0], x1: +view.zoom[1], edges: true };
    const x1 = this.last;
    const x0 = Math.max(this.first, x1 - this.nbmon.window);
    const drawn = view.drawn;
    if (drawn && !drawn.edges && drawn.px === px) {
      // Less than a pixel from what is drawn: keep it (what moved does not show yet).
      const scale = px / (drawn.x1 - drawn.x0 || 1);
      if (Math.abs(x1 - drawn.x1) * scale < 1 && Math.abs(x0 - drawn.x0) * scale < 1) return drawn;
    }
    return { x0, x1, edges: false };
  }

  draw(view) {
    if (!view.ready || this.disposed || !this.taken()) return;
    if (!view.visible || document.hidden || !view.root.isConnected || view.held) {
      view.stale = true;   // held: the user's zoom or pan moves the axes (onRelease draws)
      return;
    }
    view.stale = false;
    const full = view.root._fullLayout;
    const px = Math.max(50, full?._size?.w || view.root.clientWidth - 120);
    const range = this.range(view, px);
    const series = [...this.series.values()];
    if (!(range.x1 > range.x0) && !series.some((s) => s.length)) return;
    const columns = Math.max(1, Math.floor(px / BUCKET_PX));
    const points = series.map((s) => decimate(s, range.x0, range.x1, columns, range.edges));
    const pxPerS = px / (range.x1 - range.x0 || 1);
    const groups = bandGroups(this.sorted, range.x0, range.x1, pxPerS, this.last);
    const axes = series.map((s) => s.axis);
    const top = tops(axes, points);
    // The kernel's lines (a memory warning) show on their axes, as plotly's own autorange had them.
    for (const mark of this.nbmon.layout?.shapes || []) {
      if (top.has(mark.yref)) top.set(mark.yref, Math.max(top.get(mark.yref), mark.y0, mark.y1));
    }
    const sig = signature(axes, top, points, groups, range, px, full,
      [JSON.stringify(view.theme), JSON.stringify(view.yzoom), this.edits, view.width, full?.height,
        full?.legend?._height, this.events.size, this.title]);
    if (view.sig === sig) return;
    view.sig = sig;
    view.drawn = { ...range, px };
    view.drawnAt = performance.now();
    Object.assign(view, { series, points, groups });
    const began = performance.now();
    const own = !this.events.size;   // plotly draws the lines itself only for a user's event callbacks
    const layout = this.layout(view, groups, pxPerS, top, own);
    const frame = `${this.edits}|${own}|${frameKey(layout)}`;
    const shown = axisRanges(layout);
    if (own && view.plotted === frame) {
      this.scroll(view, shown, own);
    } else {
      view.root.style.height = `${layout.height}px`;
      this.Plotly.react(view.root, this.data(view, points, groups, layout, own), layout, {
        ...this.model.get("_config"), displaylogo: false, modeBarButtonsToRemove: MODEBAR_REMOVE,
        modeBarButtonsToAdd: [view.download], doubleClick: "autosize",
      });
      view.plotted = frame;
      // The room above the plot was the legend's last height: a new width may wrap it onto more lines.
      if (legendHeight(view.root._fullLayout) !== view.legendPx) this.schedule(view, true);
    }
    view.ranges = shown;
    const timed = view.timed;
    view.timed = true;   // not its first: that one builds the plot
    this.paint(view, own, () => {
      const ms = measure("nbmon-frame", began);
      if (timed) timedRedraw(ms);
    });
    measure("nbmon-redraw", began);
  }

  /**
   * Only the axes' ranges (``shown``) moved: plotly redraws those axes and nothing else
   * (its relayout of ranges alone skips its whole pipeline: ~3 ms here,
   * where a react is ~30), but for the x axes where the view paints them
   * (``own``), and paint() the lines.
   */
  scroll(view, shown, own) {
    const moved = {};
    for (const [key, r] of Object.entries(shown)) {
      if (own && key[0] === "x") continue;   // painted: plotly's stay until press()
      const was = view.ranges?.[key];
      if (!was || was[0] !== r[0] || was[1] !== r[1]) moved[`${key}.range`] = r;
    }
    this.moveAxes(view, moved);
  }

  /** Plotly's axes to the ranges in ``moved`` ({"xaxis.range": [a, b]}), not as the user's zoom. */
  moveAxes(view, moved) {
    if (!Object.keys(moved).length) return;
    PAGE.scrolling += 1;   // its plotly_relayout is not the user's
    this.Plotly.relayout(view.root, moved).finally(() => (PAGE.scrolling -= 1));
  }

  /**
   * What the view shows over plotly's axes, painted on its canvas (a Painter)
   * as one scene: where the view paints its x axes (``own``) the cell bands,
   * the grid and the tick labels; the lines, the streams' points as
   * decimated, styled as plotly styles their traces (colour, width, dash,
   * fill to zero), each clipped to its subplot, at the ranges plotly's axes
   * show now (also while the user pans); the bands' labels and the title
   * (text that changes every frame: never a change to the page). With the
   * user's event callbacks plotly draws the lines, bands and x axes itself.
   * ``done`` once the scene is on screen.
   */
  paint(view, own = !this.events.size, done = undefined) {
    const root = view.root, full = root._fullLayout, traces = root._fullData;
    if (!full || !view.points) return;
    if (!view.painter) {
      view.painter = new Painter(root);
      root.__nbmonPixels = () => view.painter.pixels();   // what is on the canvas, for the page's tests
    }
    const scene = { w: full.width, h: full.height, ratio: window.devicePixelRatio || 1, rects: [], grids: [],
      lines: [], texts: [] };
    const x = own ? this.paintX(scene, view, full) : null;
    const drawn = [];
    view.series.forEach((s, k) => {
      const trace = traces[view.traceOf[k]];
      const { x, y } = view.points[k];
      drawn.push({ meta: trace?.meta, name: trace?.name, x, y });
      if (!own || !trace || trace.visible !== true || !x.length) return;
      const xa = full[axisKey(trace.xaxis)], ya = full[axisKey(trace.yaxis)];
      const X = this.xScale(view, xa), Y = scale(ya, true);
      const xy = new Float32Array(2 * x.length);
      let n = 0;
      for (let i = 0; i < x.length; i++) {
        if (Number.isNaN(y[i])) continue;   // connectgaps
        xy[n++] = X(x[i]);
        xy[n++] = Y(y[i]);
      }
      const width = trace.line?.width ?? 2;
      scene.lines.push({ clip: [xa._offset, ya._offset, xa._length, ya._length], xy: xy.subarray(0, n),
        fill: trace.fill === "tozeroy" ? trace.fillcolor : null, base: Y(0), width, color: trace.line?.color,
        dash: (DASHES[trace.line?.dash] || []).map((d) => d * width) });
    });
    const labels = this.label(view, scene);
    const title = this.paintTitle(view, scene, full);
    // What the view draws, for the page's tests and benchmarks.
    root.__nbmonDrawn = { traces: drawn, bands: view.groups.map((g) => describe(g).hover), x, labels, title };
    view.painter.paint(scene, done);
    if (view.tip?.style.display === "block") this.hover(view);
  }

  /**
   * The x axes as plotly draws them, at the range the chart shows, into
   * ``scene``: in each subplot the cell bands and the grid lines, and tick
   * labels under the axes that show them (styled as the y axes: one
   * template). What it drew: {range, bands: [[a, b]], ticks: [text]}.
   */
  paintX(scene, view, full) {
    const range = this.xRange(view);
    const { tickfont: font = {}, gridcolor = "rgba(128, 128, 128, 0.25)", gridwidth = 1 } = full.yaxis;
    const ticks = [];
    for (const key of xKeys(full)) {
      const xa = full[key], ya = full[axisKey(xa.anchor)], shown = view.xaxes?.[key] || {};
      if (!ya?._length) continue;
      const X = this.xScale(view, xa);
      const [left, right, top, bottom] = [xa._offset, xa._offset + xa._length, ya._offset, ya._offset + ya._length];
      for (const g of view.groups) {
        const a = Math.max(left, X(g.a)), b = Math.min(right, X(g.b));
        if (b > a) scene.rects.push([a, top, b - a, bottom - top, `rgba(${BAND_FILL.join(", ")})`]);
      }
      const { values, step } = xTicks(range[0], range[1], xa._length);
      if (shown.showgrid !== false && gridwidth > 0) {
        // a 1 px line on a pixel, not across two
        scene.grids.push({ xs: values.map((v) => Math.round(X(v)) + 0.5), top, bottom, color: gridcolor, width: gridwidth });
      }
      if (shown.showticklabels === false) continue;
      for (const v of values) {
        const text = tickText(v, step, values);
        scene.texts.push({ text, x: X(v), y: bottom + TICK_PAD_PX, font: `${font.size || 12}px ${font.family || "sans-serif"}`,
          color: font.color || "#444", align: "center" });
        ticks.push(text);
      }
    }
    return { range, bands: view.groups.map((g) => [g.a, g.b]), ticks };
  }

  /**
   * The bands' labels, over the plot's top edge at each band's start, or at
   * the plot's left edge for one that began before it (a long cell, still
   * named), clipped to the plot's width. What it drew: [{text, box: [x, y, w, h], color}].
   */
  label(view, scene) {
    const full = view.root._fullLayout;
    const { l, t, w } = full._size;
    const X = this.xScale(view, full.xaxis);
    const font = `${LABEL_FONT_PX}px ${view.theme?.font || "sans-serif"}`;
    return view.labels.map(({ t: at, text }) => {
      const box = [l + Math.max(0, X(at) - l) + 2, t + 2, textWidth(text, font), LABEL_FONT_PX];
      const color = view.theme?.band || "#555";
      scene.texts.push({ text, x: box[0], y: box[1], font, color, clip: [l, t, w, LABEL_BOX_PX] });
      return { text, box, color };
    });
  }

  /** The title where plotly would put it ({text, box: [x, y, w, h], color}, as drawn). */
  paintTitle(view, scene, full) {
    const text = this.title ?? this.model.get("_widget_layout")?.title?.text ?? "";
    const { family = "sans-serif", size = 14, color = view.theme?.fg || "#444" } = full.title?.font || {};
    const font = `${size}px ${family}`;
    const box = [(full.title?.x ?? 0.01) * full.width, (1 - (full.title?.y ?? 1)) * full.height, textWidth(text, font), size];
    scene.texts.push({ text, x: box[0], y: box[1], font, color });
    return { text, box, color };
  }

  /** The values at the pointer, in a box of our own (plotly's hover needs its traces' points). */
  hover(view, event = view.pointer) {
    const root = view.root, full = root._fullLayout;
    view.pointer = event;
    const tip = view.tip;
    const box = root.getBoundingClientRect();
    const [px, py] = event ? [event.clientX - box.left, event.clientY - box.top] : [NaN, NaN];
    const { l, t, w, h } = full?._size || {};
    const xa = full?.xaxis;
    // Outside the plot (NaN compares false), or while a button is down (a zoom or a pan): none.
    if (!(xa && view.points && event && !event.buttons && px >= l && px <= l + w && py >= t && py <= t + h)) {
      tip.style.display = view.cursor.style.display = "none";
      return;
    }
    const [r0, r1] = this.xRange(view);
    const at = r0 + ((px - xa._offset) / xa._length) * (r1 - r0);
    const theme = view.theme || themeOf(root);
    const rows = [];
    view.series.forEach((s, k) => {
      const trace = root._fullData[view.traceOf[k]];
      const { x, text } = view.points[k];
      if (!trace || trace.visible !== true || !x.length) return;
      const i = nearest(x, at);
      rows.push([trace.line?.color || theme.fg, trace.name, text[i]]);
    });
    const band = view.groups.find((g) => g.a <= at && at <= g.b);
    tip.replaceChildren(line(fmt(at, "s"), "nbmon-hover-head"));
    for (const [color, name, value] of rows) {
      const row = line(`${name}: ${value}`);
      const swatch = document.createElement("span");
      swatch.className = "nbmon-hover-swatch";
      swatch.style.background = color;
      row.prepend(swatch);
      tip.append(row);
    }
    if (band) tip.append(line(describe(band).hover));
    Object.assign(tip.style, { display: "block", background: theme.bg, color: theme.fg, borderColor: theme.grid,
      maxWidth: `${full.width - 8}px` });
    // Right of the pointer, else left of it, and never past the chart's edges (a narrow one: it wraps).
    const width = tip.offsetWidth;
    const left = px + 12 + width <= full.width ? px + 12 : Math.max(0, Math.min(px - 12 - width, full.width - width));
    Object.assign(tip.style, { left: `${left}px`, top: `${t + 4}px` });
    Object.assign(view.cursor.style, { display: "block", left: `${px}px`, top: `${t}px`, height: `${h}px`,
      background: theme.grid });
  }

  /**
   * The figure's traces, the streamed ones with their ``points`` where
   * plotly draws them (not ``own``: else empty, paint() draws them), then
   * the streams' own traces; the cells' bars (hover texts for plotly's
   * hover) as high as their axis in ``layout``. Each stream's trace index
   * in ``view.traceOf``.
   */
  data(view, points, groups, layout, own) {
    const live = new Map();
    const added = [];
    const traces = this.model.get("_widget_data");
    const none = { x: [NaN], y: [NaN], text: [""] };   // one point, which draws nothing: plotly hides a trace with none
    view.traceOf = view.series.map((s, k) => {
      if (!s.stream.trace) {
        live.set(s.stream.index, k);
        return s.stream.index;
      }
      added.push({ ...s.stream.trace, ...(own ? none : points[k]) });
      return traces.length + added.length - 1;
    });
    const bars = { x: [], width: [], hovertext: [] };
    for (const group of own ? [] : groups) {
      bars.x.push((group.a + group.b) / 2);
      bars.width.push(group.b - group.a);
      bars.hovertext.push(describe(group).hover);
    }
    return traces.map((trace, i) => {
      const out = { ...trace };
      for (const key of ["x", "y", "width", "base"]) if (trace[key] && trace[key].dtype) out[key] = typed(trace[key]);
      if (live.has(i)) Object.assign(out, own ? none : points[live.get(i)]);
      if (trace.meta === "cells") {
        const high = layout[(trace.yaxis || "y").replace("y", "yaxis")]?.range?.[1] ?? 1;
        Object.assign(out, bars, { y: bars.x.map(() => high) });
      }
      return out;
    }).concat(added);
  }

  layout(view, groups, pxPerS, top, own) {
    // The kernel's patch over the figure's layout: its shapes and notes added, the rest replaced.
    const { shapes: marks = [], annotations = [], ...patch } = this.nbmon.layout || {};
    const stored = { ...this.model.get("_widget_layout"), ...patch };
    const theme = view.theme || themeOf(view.root);
    const end = view.drawn.x1;
    const revision = (view.revision = (view.revision || 0) + 1);
    view.labels = [];
    const shapes = groups.map((group, k) => {
      const { label } = describe(group);
      const first = group.cells[0], last = group.cells[group.cells.length - 1];
      // A label may run past its band, not into the next band's.
      const room = ((groups[k + 1]?.a ?? end + 1e9) - group.a) * pxPerS;
      if (room >= label.length * LABEL_PX_PER_CHAR + 4) view.labels.push({ t: first.t0, text: label });
      // The cells' own ends (plotly clips a band to the plot), a running one's far
      // beyond the newest point: a band stays as drawn while the window scrolls.
      return {
        type: "rect", xref: "x", yref: "paper", x0: Math.min(first.t0, group.a),
        x1: last.t1 == null ? first.t0 + RUNNING_S : group.b, y0: 0, y1: 1, layer: "below",
        name: "nbmon-cell", fillcolor: `rgba(${BAND_FILL.join(", ")})`, line: { width: 0 },
      };
    });
    view.bands = steady(shapes, view.bands, pxPerS);
    const axes = ranges(stored, view.drawn, top, view.yzoom, view.autoscaled || 0);
    // Painted (paintX()): plotly's x axes draw only their titles. view.xaxes: as plotly would draw them.
    view.xaxes = {};
    for (const key of own ? Object.keys(axes) : []) {
      if (key[0] !== "x") continue;
      view.xaxes[key] = axes[key];
      axes[key] = { ...axes[key], showgrid: false, showticklabels: false, zeroline: false,
        title: { ...(axes[key].title || {}), standoff: X_TITLE_STANDOFF_PX } };
    }
    return {
      ...stored,
      ...axes,
      autosize: false,
      width: view.width || view.root.clientWidth,
      ...this.top(view, stored),
      font: { ...(stored.font || {}), color: theme.fg },
      hovermode: own ? false : stored.hovermode,
      hoverlabel: { bgcolor: theme.bg, bordercolor: theme.grid, font: { color: theme.fg } },
      shapes: (stored.shapes || []).filter((s) => s.name !== "nbmon-cell").concat(marks, own ? [] : view.bands),
      annotations: (stored.annotations || []).concat(annotations),
      datarevision: revision,
    };
  }

  /** The figure for the download button: plotly draws all of it, the title, its x axes and the bands too. */
  imageLayout(view) {
    const layout = { ...view.root.layout, hovermode: false };
    layout.title = { ...layout.title, text: view.root.__nbmonDrawn?.title.text ?? "" };
    if (this.events.size) return layout;
    const range = this.xRange(view);
    for (const [key, axis] of Object.entries(view.xaxes || {})) layout[key] = { ...axis, range: [...range] };
    layout.shapes = [...(layout.shapes || []), ...view.bands];
    return layout;
  }

  /**
   * Room above the plot for the title and the legend, each on lines of
   * their own (the chart grows by what they need), and the title under the
   * toolbar when they would meet: a narrow chart.
   */
  top(view, stored) {
    const full = view.root._fullLayout;
    const width = full?.width || view.root.clientWidth;
    const title = this.title ?? stored.title?.text ?? "";
    const lines = textWidth(title, "14px sans-serif") + MODEBAR_PX + 24 > width ? 2 : 1;
    view.legendPx = legendHeight(full);   // as last drawn: draw() checks it after the react
    const t = lines * TITLE_PX + view.legendPx + 8;
    const margin = { ...(stored.margin || {}), t };
    const height = (stored.height || 400) + Math.max(0, t - (stored.margin?.t || 0));
    return {
      margin, height,
      title: { ...(stored.title || {}), text: "", yref: "container", yanchor: "top",
        y: 1 - ((lines - 1) * TITLE_PX + 4) / height },
      legend: { ...(stored.legend || {}), y: 1.0, yanchor: "bottom" },
    };
  }

  dispose() {
    this.disposed = true;
    clearInterval(this.watch);
    this.model.off("msg:custom", this.onMessage);
    this.model.off("change", this.onEdit);
    this.model.off("change:_nbmon", this.onDeclared);
    PAGE.lives.delete(this.id);
    for (const view of [...this.views.values()]) {
      const record = view.record;
      this.removeView(view);
      if (!record) continue;
      record.classList.remove("nbmon-live-mounted", "nbmon-live-stale");
      // The kernel went away without stopping: say so above its last record.
      disconnected(record, this.stopped ? null :
        "nbmon: kernel disconnected, the live chart stopped; below, the figures as last recorded");
    }
  }
}

const legendHeight = (full) => full?.legend?._height || LEGEND_PX;

let canvas;
function textWidth(text, font) {
  canvas ??= document.createElement("canvas").getContext("2d");
  canvas.font = font;
  return canvas.measureText(text).width;
}

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

const axisKey = (id) => (id || "x").replace(/^([xy])/, "$1axis");
const xKeys = (full) => Object.keys(full).filter((key) => /^xaxis\d*$/.test(key) && full[key]?._length);

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
function scale(axis, upwards) {
  const [r0, r1] = axis.range;
  const k = axis._length / (r1 - r0 || 1);
  return upwards ? (v) => axis._offset + axis._length - (v - r0) * k : (v) => axis._offset + (v - r0) * k;
}

/** Index of the value in ascending ``xs`` (not empty) nearest ``t``. */
export function nearest(xs, t) {
  let lo = 0, hi = xs.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < t) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 && t - xs[lo - 1] < xs[lo] - t ? lo - 1 : lo;
}

function line(text, className = "") {
  const div = document.createElement("div");
  div.className = className;
  div.textContent = text;
  return div;
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

const NOTE = ':scope > [data-nbmon="disconnected"]';

/** Put ``text`` above a record as its one "disconnected" note (null: none). */
function disconnected(record, text) {
  record.querySelector(NOTE)?.remove();
  if (text === null) return;
  const note = document.createElement("div");
  note.className = "nbmon-live-note";
  note.dataset.nbmon = "disconnected";
  note.textContent = text;
  record.prepend(note);
}

export default {
  initialize({ model }) {
    if (model.get("_nbmon").carrier) {   // closed by the kernel once it has sent the bundle
      loadBundle(model, false);
      return undefined;
    }
    installStyle();
    const live = new Live(model);
    return () => live.dispose();
  },
  async render({ model, el }) {
    const live = PAGE.lives.get(model.get("_nbmon").id);
    if (!live) return undefined;
    await live.ready;
    const view = live.addView(el);
    return () => live.removeView(view);
  },
};
