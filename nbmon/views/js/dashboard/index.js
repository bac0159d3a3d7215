// nbmon live dashboard: the front end of nbmon.views.dashboard's FigureWidget.
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
// The modules: bundle.js (plotly's bundle), series.js (a trace's points),
// bands.js (cell bands), axes.js (ranges, ticks, what a redraw would show),
// theme.js (colours), paint.js (the canvas and its worker), page.js (the
// page's watchers and redraw timing), live.js (the model and its views), and
// this one (the style and the widget). nbmon/views/frontend.py joins them
// and ../format.js into the one module anywidget loads.

import { PAGE } from "./page.js";
import { loadBundle } from "./bundle.js";
import { Live } from "./live.js";

const STYLE_ID = "nbmon-live-style-5";
const CSS = `
.nbmon-live-record.nbmon-live-mounted > .nbmon-live-static { display: none; }
[data-nbmon-live-output]:has(.nbmon-live-record.nbmon-live-mounted) + :has(img) { display: none; }
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

function installStyle() {
  if (document.getElementById(STYLE_ID)) return;
  const style = document.createElement("style");
  style.id = STYLE_ID;
  style.textContent = CSS;
  document.head.appendChild(style);
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
    el.classList.add("nbmon-live-view");   // styled as a mounted view: its lines' canvas lies over the plot
    const view = live.addView(el);
    return () => live.removeView(view);
  },
};
