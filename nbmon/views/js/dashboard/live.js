// The live model (class Live): one per dashboard in the page, holding its
// streams' points and cells, and its views: each a plotly view mounted into
// the kernel's static record, drawn (draw()) as points arrive and painted
// (paint()) on a canvas over the plot; and the note a record gets when the
// kernel goes silent.

import { fmt } from "../format.js";
import { PAGE, drawingViews, measure, redrawMs, redrawWait, timedRedraw, watchPage } from "./page.js";
import { loadBundle } from "./bundle.js";
import { Painter } from "./paint.js";
import { Series, bufferOf, decimate, nearest, typed } from "./series.js";
import { BAND_FILL, bandGroups, describe, steady } from "./bands.js";
import { themeOf } from "./theme.js";
import {
  axisKey, axisRanges, frameKey, ranges, scale, signature, tickText, tops, userRanges, xKeys, xTicks,
} from "./axes.js";

const BUCKET_PX = 2;            // a redraw's column width: its lowest and highest point
const LABEL_PX_PER_CHAR = 6.5;  // a band label's width at 10 px, to show only labels that fit
const LABEL_FONT_PX = 10;       // a band label's font, in the UI's family
const LABEL_BOX_PX = 14;        // ...in a strip this high along the plot's top edge
const RUNNING_S = 1e6;          // a running cell's band: past any window's end, clipped by plotly
const TICK_PAD_PX = 4;          // an x tick label's top below its plot
const X_TITLE_STANDOFF_PX = 34; // the x title below the painted tick labels, where plotly's own put it
const DASHES = { dot: [1, 2], dash: [4, 2], longdash: [8, 2], dashdot: [4, 2, 1, 2], longdashdot: [8, 2, 1, 2] };  // x line width
// Plotly's "reset axes" and double click would go back to the first ranges
// drawn; "autoscale" and a double click that autoscales follow the window again.
const MODEBAR_REMOVE = ["toImage", "sendChartToCloud", "select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "resetScale2d",
  "hoverClosestCartesian", "hoverCompareCartesian", "toggleSpikelines"];
const MODEBAR_PX = 4 * 28;      // what is left of it: zoom, pan, autoscale, download
const TITLE_PX = 24;            // a title line (14 px font)
const LEGEND_PX = 20;           // a legend line, before plotly has drawn one

// The element that holds the record's output, whatever the front end calls it
// (JupyterLab, VS Code, Voila): its first ancestor with a next sibling, which
// is the timeline picture's output (the kernel displays it right after the
// record).
function recordOutput(record) {
  for (let el = record.parentElement; el && el !== document.body; el = el.parentElement) {
    if (el.nextElementSibling) return el;
  }
  return null;
}

// Marked, so that the style hides that picture under the chart.
function markOutput(record) {
  const output = recordOutput(record);
  if (output?.nextElementSibling.querySelector("img")) output.setAttribute("data-nbmon-live-output", "");
}

export class Live {
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
      markOutput(record);
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
    if (msg.type === "nbmon:record") this.rewrite(msg.html, msg.picture);
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

  /**
   * The kernel's record, re-sent: its figures into every record of ours in
   * the page, and its timeline into the picture after it (where the front
   * end applied the display updates, the same).
   */
  rewrite(html, picture) {
    const fresh = new DOMParser().parseFromString(html, "text/html").querySelector(".nbmon-live-static");
    if (!fresh) return;
    for (const record of document.querySelectorAll(`.nbmon-live-record[data-nbmon-live="${this.id}"]`)) {
      record.querySelector(":scope > .nbmon-live-static")?.replaceWith(document.importNode(fresh, true));
      const img = picture && recordOutput(record)?.nextElementSibling.querySelector("img");
      if (!img) continue;
      img.src = `data:image/png;base64,${picture.png}`;
      Object.assign(img, { width: picture.width, height: picture.height });
    }
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

function line(text, className = "") {
  const div = document.createElement("div");
  div.className = className;
  div.textContent = text;
  return div;
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
