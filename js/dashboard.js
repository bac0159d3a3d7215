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
//     (the kernel never needs them: it knows what it sent). User actions
//     (zoom, legend clicks) still reach the kernel as plotly sends them.
//   * New samples do not travel as plotly trait updates (whole arrays, twice
//     per frame) but as one custom message per frame holding only the new
//     points ("nbmon:append": x float64, one float32 y per live trace, the
//     title, changed cell bands). They are appended to the model's
//     _widget_data in place (never model.set: nothing to send back), so any
//     view made later starts from the current data, and redrawn with
//     Plotly.react, only while the view is on screen and the tab visible.
//
// Where it shows: the kernel displays a static record (text/html: summary and
// SVG timeline) with data-nbmon-live="<id>", and no widget view. When this
// model lives in the page it mounts a plotly view into that record and hides
// the static part; when it does not (kernel gone, nbconvert, GitHub, a saved
// notebook reopened) the record is all there is, and it shows the figures.
// The kernel re-sends the record now and then to keep it current; the view
// is moved into the new copy, not redrawn. Displaying the widget itself
// (display(dashboard.widget)) also works: render() below.
//
// Built into nbmon/notebook/static/dashboard.js by js/build.mjs, which
// inlines format.js.

import { fmt } from "./format.js";

const STYLE_ID = "nbmon-live-style";
const CSS = `
.nbmon-live-record.nbmon-live-mounted > .nbmon-live-static { display: none; }
.nbmon-live-view { width: 100%; min-width: 0; }
.nbmon-live-record.nbmon-live-stale > .nbmon-live-view { opacity: 0.45; }
.nbmon-live-note {
  font: 12px var(--jp-ui-font-family, system-ui, sans-serif);
  color: var(--jp-warn-color0, #b26b00);
  margin: 2px 0 4px;
}
`;

const SIZE_KEYS = new Set(["width", "height", "autosize"]);
// Bundles of the page, shared by its dashboards: version -> {promise, done, asked}.
const BUNDLES = (globalThis.__nbmonPlotlyBundles ??= new Map());
// Live dashboards of the page by their record id, for render().
const LIVE = (globalThis.__nbmonLive ??= new Map());

function installStyle() {
  if (document.getElementById(STYLE_ID)) return;
  const style = document.createElement("style");
  style.id = STYLE_ID;
  style.textContent = CSS;
  document.head.appendChild(style);
}

// The kernel pushes plotly's bundle once per process, a moment after its
// first dashboard opens; a page that missed it (reloaded, a second tab) asks
// for it after ASK_AFTER_MS. Asking needs the kernel's main thread, which a
// running cell holds: a push does not.
const ASK_AFTER_MS = 3000;

function loadBundle(model) {
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
  setTimeout(() => {
    if (entry.done || entry.asked) return;
    entry.asked = true;
    model.send({ type: "nbmon:bundle" });
  }, ASK_AFTER_MS);
  return entry.promise;
}

async function importBundle(bytes) {
  const url = URL.createObjectURL(new Blob([bytes], { type: "text/javascript" }));
  try {
    const mod = await import(url);
    const view = mod.FigureView.prototype;
    // The echoes described at the top; the module is ours alone (a private
    // copy), so plotly's own FigureWidgets keep theirs.
    view._sendTraceDeltas = () => {};
    view._sendLayoutDelta = () => {};
    // A new size follows the page, not the user: no message for it either.
    const relayout = view.handle_plotly_relayout;
    view.handle_plotly_relayout = function (change) {
      if (change && Object.keys(change).every((k) => SIZE_KEYS.has(k))) return;
      relayout.call(this, change);
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

function shipped(array) {
  // A fresh array at offset 0: plotly's deserializer reads value.buffer whole.
  const own = array.byteOffset === 0 && array.buffer.byteLength === array.byteLength ? array : array.slice();
  return { dtype: own instanceof Float32Array ? "float32" : "float64", shape: [own.length], value: own };
}

function bufferOf(dataView, Type) {
  return new Type(dataView.buffer.slice(dataView.byteOffset, dataView.byteOffset + dataView.byteLength));
}

// old + new, without the points older than `window` before the newest x.
export function appendWindow(oldX, oldY, newX, newY, window) {
  const n = oldX.length + newX.length;
  const x = new Float64Array(n);
  x.set(oldX);
  x.set(newX, oldX.length);
  const y = new Float32Array(n);
  y.set(oldY);
  y.set(newY, oldY.length);
  const cut = n ? x[n - 1] - window : 0;
  let from = 0;
  while (from < n - 1 && x[from] < cut) from += 1;
  return { x: x.subarray(from), y: y.subarray(from), dropped: from };
}

function themeColor() {
  const css = getComputedStyle(document.body);
  return css.getPropertyValue("--jp-ui-font-color1").trim() || "#444";
}

class Live {
  constructor(model) {
    this.model = model;
    this.nbmon = model.get("_nbmon");
    this.id = this.nbmon.id;
    this.views = new Map(); // root element -> view
    this.cells = new Map(); // cell id -> {n, label, t0, t1}
    this.stopped = false;
    this.disposed = false;
    this.revision = 0;
    this.onMessage = (msg, buffers) => this.message(msg, buffers);
    model.on("msg:custom", this.onMessage);
    for (const cell of this.nbmon.cells || []) this.cells.set(cell.id, cell);
    this.ready = loadBundle(model).then(({ mod, Plotly }) => {
      if (this.disposed) return;
      this.Plotly = Plotly;
      this.plotly = mod.default();
      this.plotly.initialize({ model });
      this.scan();
    });
    // Records appear (and are re-rendered by the kernel's updates) anywhere in
    // the page: look for ours when the DOM changes outside a plot.
    this.observer = new MutationObserver((records) => {
      if (records.some((r) => !(r.target.closest && r.target.closest(".js-plotly-plot")))) this.scan();
    });
    this.observer.observe(document.body, { childList: true, subtree: true });
    this.themeObserver = new MutationObserver(() => this.drawAll());
    this.themeObserver.observe(document.body, {
      attributes: true,
      attributeFilter: ["data-jp-theme-light", "data-jp-theme-name"],
    });
    this.onVisibility = () => !document.hidden && this.drawAll();
    document.addEventListener("visibilitychange", this.onVisibility);
    // No frame for a while: the kernel is gone, restarting, or holds the GIL in C code.
    this.heard = performance.now();
    this.watch = setInterval(() => this.markStale(performance.now() - this.heard > this.nbmon.stale_s * 1000), 1000);
    LIVE.set(this.id, this);
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
  }

  addView(root) {
    const view = { root, ready: false, visible: true, stale: false, record: null };
    this.views.set(root, view);
    const rendered = (event) => {
      if (event.detail.element !== root) return;
      document.removeEventListener("plotlywidget-after-render", rendered);
      view.ready = true;
      this.draw(view);
    };
    document.addEventListener("plotlywidget-after-render", rendered);
    view.remove = this.plotly.render({ model: this.model, el: root });
    view.io = new IntersectionObserver((entries) => {
      view.visible = entries[entries.length - 1].isIntersecting;
      if (view.visible && view.stale) this.draw(view);
    });
    view.io.observe(root);
    let width = 0;
    view.ro = new ResizeObserver(() => {
      if (!view.ready || root.clientWidth === width || !root.isConnected) return;
      width = root.clientWidth;
      this.Plotly.Plots.resize(root);
    });
    view.ro.observe(root);
    return view;
  }

  removeView(view) {
    view.io.disconnect();
    view.ro.disconnect();
    view.remove();
    if (view.record) view.root.remove();
    this.views.delete(view.root);
  }

  message(msg, buffers) {
    if (!msg) return;
    if (msg.type === "nbmon:stopped") this.stopped = true;
    if (msg.type !== "nbmon:append") return;
    this.heard = performance.now();
    const data = this.model.get("_widget_data");
    const layout = this.model.get("_widget_layout");
    const window = this.nbmon.window;
    const x = bufferOf(buffers[0], Float64Array);
    this.nbmon.traces.forEach((trace, k) => {
      const target = data[trace.index];
      const y = bufferOf(buffers[k + 1], Float32Array);
      const joined = appendWindow(typed(target.x), typed(target.y), x, y, window);
      const text = (target.text && target.text.length === typed(target.x).length ? target.text : this.texts(target, trace))
        .slice(joined.dropped)
        .concat(Array.from(y, (v) => fmt(v, trace.unit)));
      Object.assign(target, { x: shipped(joined.x), y: shipped(joined.y), text });
    });
    if (msg.title != null) layout.title = { ...(layout.title || {}), text: msg.title };
    for (const cell of msg.cells || []) this.cells.set(cell.id, cell);
    this.last = x.length ? x[x.length - 1] : this.last;
    this.drawAll();
  }

  texts(target, trace) {
    return Array.from(typed(target.y), (v) => fmt(v, trace.unit));
  }

  // The cells' bands (shapes, labelled with the prompt number) and the
  // invisible bars that give them a hover text (shapes have none).
  cellParts() {
    const shapes = [];
    const bars = { x: [], width: [], hovertext: [] };
    const end = this.last ?? 0;
    for (const cell of this.cells.values()) {
      const t1 = cell.t1 ?? end;
      if (t1 < cell.t0) continue;
      const label = `[${cell.n ?? " "}]`;
      shapes.push({
        type: "rect", xref: "x", yref: "paper", x0: cell.t0, x1: t1, y0: 0, y1: 1, layer: "below",
        fillcolor: "rgba(128, 128, 128, 0.10)", line: { width: 0 },
        label: { text: label, textposition: "top left", font: { size: 10, color: "rgba(128, 128, 128, 0.9)" } },
      });
      bars.x.push((cell.t0 + t1) / 2);
      bars.width.push(Math.max(t1 - cell.t0, 1e-3));
      const took = cell.t1 == null ? "running" : fmt(cell.t1 - cell.t0, "s");
      bars.hovertext.push(`In ${label} ${cell.label || ""} · ${took}`);
    }
    return { shapes, bars };
  }

  drawAll() {
    for (const view of this.views.values()) this.draw(view);
  }

  draw(view) {
    if (!view.ready || this.disposed) return;
    if (!view.visible || document.hidden || !view.root.isConnected) {
      view.stale = true;
      return;
    }
    view.stale = false;
    const traces = this.nbmon.traces;
    const live = new Map(traces.map((t) => [t.index, t]));
    if (this.last === undefined) {
      const first = this.model.get("_widget_data")[traces[0]?.index];
      const x = typed(first && first.x);
      this.last = x.length ? x[x.length - 1] : 0;
    }
    const { shapes, bars } = this.cellParts();
    const data = this.model.get("_widget_data").map((trace, i) => {
      const out = { ...trace };
      for (const key of ["x", "y", "width", "base"]) if (trace[key] && trace[key].dtype) out[key] = typed(trace[key]);
      if (live.has(i) && !(trace.text && trace.text.length === out.y.length)) {
        out.text = trace.text = this.texts(trace, live.get(i));
      }
      if (trace.meta === "cells") Object.assign(out, bars, { y: bars.x.map(() => 1) });
      return out;
    });
    const stored = this.model.get("_widget_layout");
    const userShapes = (stored.shapes || []).filter((s) => s.name !== "nbmon-cell");
    const layout = {
      ...stored,
      font: { ...(stored.font || {}), color: themeColor() },
      shapes: userShapes.concat(shapes.map((s) => ({ ...s, name: "nbmon-cell" }))),
      datarevision: ++this.revision,
    };
    this.Plotly.react(view.root, data, layout);
  }

  dispose() {
    this.disposed = true;
    clearInterval(this.watch);
    this.observer.disconnect();
    this.themeObserver.disconnect();
    document.removeEventListener("visibilitychange", this.onVisibility);
    this.model.off("msg:custom", this.onMessage);
    LIVE.delete(this.id);
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
    installStyle();
    const live = new Live(model);
    return () => live.dispose();
  },
  async render({ model, el }) {
    const live = LIVE.get(model.get("_nbmon").id);
    if (!live) return undefined;
    await live.ready;
    const view = live.addView(el);
    return () => live.removeView(view);
  },
};
