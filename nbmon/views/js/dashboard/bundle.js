// plotly's bundle (plotly.js and its FigureModel and FigureView), sent by the
// kernel and imported once per page and plotly version, with the changes that
// make streaming one-way: the echoes dropped, and the user's events sent only
// where the kernel's code asked for them.

import { PAGE } from "./page.js";

const SIZE_KEYS = new Set(["width", "height", "autosize"]);
// Bundles of the page, shared by its dashboards: version -> {promise, done, asked}.
const BUNDLES = (globalThis.__nbmonPlotlyBundles ??= new Map());

// The kernel pushes plotly's bundle once per process: through a carrier
// model (its "_nbmon" says carrier: true, nothing else) as %resmon starts, so
// that the page imports it while the kernel builds the chart, or else through
// its first dashboard's model; a page that missed it (reloaded, a second tab)
// asks a dashboard for it after ASK_AFTER_MS; at once where the kernel had
// pushed it before the dashboard's model was made and the page has no copy
// (Voila's page connects after the notebook ran). Asking needs the kernel's
// main thread, which a running cell holds: a push does not.
const ASK_AFTER_MS = 3000;

export function loadBundle(model, ask = true) {
  const { bundle: version, pushed } = model.get("_nbmon");
  const missed = pushed && !BUNDLES.has(version);
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
  }, missed ? 0 : ASK_AFTER_MS);
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
