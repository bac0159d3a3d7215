// Painting: what a view draws over its plot, on a canvas of its own.
//
// A view paints a scene (Live.paint()): plain data, in the canvas's pixels,
// that paintScene() draws on a 2D context. Where the browser has
// OffscreenCanvas it is drawn by a worker of the view's own, straight to the
// compositor: the page's main thread then does no frame for a redraw (in a
// 1,000-cell JupyterLab page a main-thread frame, even one that changes
// only a canvas, costs the browser ~30 ms of CPU in commits, intersection
// observers and hit tests; a worker's ~5 ms). Elsewhere it is drawn on the
// page's thread.

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
export class Painter {
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
