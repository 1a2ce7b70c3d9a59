// The job page's per-step curves (job.js draws with them): each series as reported (faint) and smoothed by an
// exponential moving average, debiased as TensorBoard's smoothing slider does (bold); zoom by dragging across a chart
// to show those steps, double-click to show them all again. Every chart shares the step range and the smoothing.
// Gridlines at round values; a hover (or keyboard) readout of every series at a step; series told apart by dash and
// marker shape as well as colour, named in a legend; an outlier (a first step's 17 s) is clipped, not allowed to
// flatten the rest: drawn as a triangle at the top edge, its value in the readout and its tooltip.
// Keyboard, on a focused chart: Left/Right move the readout, + and - zoom around it, Shift+Left/Right pan, 0 or
// Escape show every step. Plain SVG, no libraries.
window.Echo2Curves = (function () {
  "use strict";
  const W = 600, H = 240, PAD = 34;
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const state = { lo: null, hi: null, smoothing: 0.6, redraw: () => {} };
  const AXIS = "#6b7280";  // 4.8:1 on white: axes and tick labels are read, not decoration (WCAG 1.4.11)

  // TensorBoard's: last = last * w + (1 - w) * v, divided by 1 - w^n so the first points are not pulled to 0.
  function ema(values, weight) {
    let last = 0;
    return values.map((v, i) => {
      last = last * weight + (1 - weight) * v;
      return weight > 0 ? last / (1 - weight ** (i + 1)) : v;
    });
  }

  const label = (v) => (Math.abs(v) >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toPrecision(2));
  const reading = (v) => (Math.abs(v) >= 1000 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(3) : v.toPrecision(3));

  // Round tick values (1, 2 or 5 times a power of ten) from lo to hi, about ``count`` of them.
  function ticks(lo, hi, count) {
    const raw = (hi - lo) / count, power = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  // The top of the scale: every value, unless some lie far above the rest (more than 3 interquartile ranges above
  // the third quartile, and more than twice it): then the largest value under that fence, and the rest is clipped.
  function robustTop(values) {
    const v = [...values].sort((a, b) => a - b), q = (p) => v[Math.min(v.length - 1, Math.floor(p * (v.length - 1)))];
    const fence = Math.max(q(0.75) + 3 * (q(0.75) - q(0.25)), 2 * q(0.75));
    const under = v.filter((x) => x <= fence);
    return v.length >= 5 && under.length < v.length && under.length ? under[under.length - 1] : v[v.length - 1];
  }

  const DASHES = ["", "6 4", "2 3", "8 3 2 3"];  // the n-th series' stroke: told apart without colour too

  // series: [{cls, color, label, points: [[step, value], ...]}] (points in step order); dots: [{step, value, cls,
  // color, title}] (drawn as diamonds); dotLabel: the legend's name for them; yFloor / yCeil: values the y range
  // always includes; robust: clip outliers (see robustTop); empty: what an empty chart says.
  function draw(svg, { series, dots = [], dotLabel = "", yFloor = 0, yCeil = null, unit = "", empty = "",
    robust = false }) {
    const steps = [...series.flatMap((s) => s.points.map((p) => p[0])), ...dots.map((d) => d.step)];
    const axes = `<line x1="${PAD}" y1="${H - PAD}" x2="${W - PAD}" y2="${H - PAD}" stroke="${AXIS}"/>` +
      `<line x1="${PAD}" y1="${PAD}" x2="${PAD}" y2="${H - PAD}" stroke="${AXIS}"/>`;
    if (!steps.length) {
      svg.innerHTML = axes + `<text class="empty" x="${W / 2}" y="${H / 2}" font-size="12" fill="#555" text-anchor="middle">${esc(empty)}</text>`;
      svg.zoomRange = null;
      svg.view = null;
      return;
    }
    let lo = state.lo ?? Math.min(...steps), hi = state.hi ?? Math.max(...steps);
    if (hi - lo < 1) hi = lo + 1;
    const inView = (step) => step >= lo && step <= hi;
    const lines = series.map((s, i) => {
      const values = s.points.map((p) => p[1]);
      const smooth = ema(values, state.smoothing);
      const keep = s.points.map((p, j) => [p[0], p[1], smooth[j]]).filter((p) => inView(p[0]));
      return { ...s, dash: s.dash ?? DASHES[i % DASHES.length], keep };
    });
    const shownDots = dots.filter((d) => inView(d.step));
    const shown = [...lines.flatMap((l) => l.keep.map((p) => p[1])), ...shownDots.map((d) => d.value)];
    const yLo = Math.min(yFloor, ...shown);
    const top = robust ? robustTop(shown) : Math.max(...shown);
    let yHi = Math.max(yCeil ?? -Infinity, top);
    if (yCeil === null) yHi *= 1.1;
    if (!(yHi > yLo)) yHi = yLo + 1;
    const x = (v) => PAD + (W - 2 * PAD) * (v - lo) / (hi - lo);
    const y = (v) => Math.max(PAD, H - PAD - (H - 2 * PAD) * (v - yLo) / (yHi - yLo));  // clipped at the top
    const poly = (cls, color, width, opacity, dash, pts) => (pts.length ? `<polyline class="${cls}" fill="none" stroke="${color}" ` +
      `stroke-width="${width}" stroke-opacity="${opacity}"${dash ? ` stroke-dasharray="${dash}"` : ""} ` +
      `points="${pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ")}"/>` : "");
    let out = "";
    for (const t of ticks(yLo, yHi, 4)) {  // gridlines, labelled at round values
      out += `<line class="grid" x1="${PAD}" x2="${W - PAD}" y1="${y(t).toFixed(1)}" y2="${y(t).toFixed(1)}" stroke="#e3e6ea"/>` +
        `<text class="y-tick" x="${PAD - 3}" y="${(y(t) + 3).toFixed(1)}" font-size="10" fill="${AXIS}" text-anchor="end">${esc(label(t))}</text>`;
    }
    for (const t of ticks(lo, hi, 6).filter((t) => Number.isInteger(t) && t > lo && t < hi)) {
      out += `<line class="grid" y1="${PAD}" y2="${H - PAD}" x1="${x(t).toFixed(1)}" x2="${x(t).toFixed(1)}" stroke="#eef0f3"/>` +
        `<text class="x-tick" x="${x(t).toFixed(1)}" y="${H - PAD + 14}" font-size="10" fill="${AXIS}" text-anchor="middle">${t}</text>`;
    }
    out += axes + (unit ? `<text x="2" y="${PAD - 8}" font-size="10" fill="${AXIS}">${esc(unit.trim())}</text>` : "") +
      `<text class="x-lo" x="${PAD}" y="${H - PAD + 26}" font-size="10" fill="${AXIS}">step ${lo}</text>` +
      `<text class="x-hi" x="${W - PAD}" y="${H - PAD + 26}" font-size="10" fill="${AXIS}" text-anchor="end">step ${hi}</text>`;
    for (const l of lines) {
      out += poly(`raw ${l.cls}-raw`, l.color, 1, 0.35, l.dash, l.keep.map((p) => [p[0], p[1]])) +
        poly(l.cls, l.color, 2, 1, l.dash, l.keep.map((p) => [p[0], p[2]]));
      for (const p of l.keep.filter((p) => p[1] > yHi)) {  // off the scale: a triangle at the top edge, its value said
        out += `<path class="clipped" d="M${x(p[0]).toFixed(1)},${PAD - 7} l5,8 l-10,0 z" fill="${l.color}">` +
          `<title>${esc(l.label || l.cls)} at step ${p[0]}: ${esc(reading(p[1]) + unit)} (above the scale)</title></path>`;
      }
    }
    out += shownDots.map((d) => `<path class="${d.cls}" d="M${x(d.step).toFixed(1)},${(y(d.value) - 5).toFixed(1)} l5,5 l-5,5 l-5,-5 z" ` +
      `fill="${d.color}"><title>${esc(d.title)}</title></path>`).join("");
    out += legend(lines, dots.length ? { color: dots[0].color, label: dotLabel } : null);
    out += `<g class="readout" visibility="hidden"><line class="cursor" y1="${PAD}" y2="${H - PAD}" stroke="#1d2330" stroke-dasharray="3 3"/></g>`;
    out += `<rect class="zoom-band" x="0" y="${PAD}" width="0" height="${H - 2 * PAD}" fill="#2a6fdb" fill-opacity="0.15" visibility="hidden"/>`;
    svg.innerHTML = out;
    svg.zoomRange = { lo, hi };
    svg.allSteps = { min: Math.min(...steps), max: Math.max(...steps) };
    svg.view = { lines, dots: shownDots, x, unit, lo, hi, clippedAbove: yHi };
    svg.dataset.lo = lo;
    svg.dataset.hi = hi;
    if (svg.cursorStep != null) readout(svg, svg.cursorStep);
  }

  // Each series' name beside a sample of its stroke (and the dots' diamond), top right, inside the top margin.
  function legend(lines, dot) {
    const items = [...lines.filter((l) => l.label).map((l) => ({ ...l, kind: "line" })),
      ...(dot && dot.label ? [{ ...dot, kind: "dot" }] : [])];
    let xAt = W - PAD, out = "";
    for (const item of items.reverse()) {
      const width = 34 + 6.5 * item.label.length;
      xAt -= width;
      const sample = item.kind === "line"
        ? `<line x1="${xAt}" x2="${xAt + 20}" y1="${PAD - 12}" y2="${PAD - 12}" stroke="${item.color}" stroke-width="2"${item.dash ? ` stroke-dasharray="${item.dash}"` : ""}/>`
        : `<path d="M${xAt + 10},${PAD - 17} l5,5 l-5,5 l-5,-5 z" fill="${item.color}"/>`;
      out = `<g class="legend-item">${sample}<text x="${xAt + 24}" y="${PAD - 8}" font-size="10" fill="#1d2330">${esc(item.label)}</text></g>` + out;
    }
    return out;
  }

  // The readout at ``step`` (the nearest step any series has): a dashed cursor and, below the chart, every series'
  // value there as reported and smoothed (a live region: a screen reader hears it as the cursor moves).
  function readout(svg, step) {
    const view = svg.view, g = svg.querySelector(".readout"), text = svg.readoutText;
    if (!view || !g) return;
    const candidates = [...view.lines.flatMap((l) => l.keep.map((p) => p[0])), ...view.dots.map((d) => d.step)];
    if (!candidates.length) return;
    const at = candidates.reduce((best, s) => (Math.abs(s - step) < Math.abs(best - step) ? s : best), candidates[0]);
    svg.cursorStep = at;
    const cursor = g.querySelector(".cursor");
    cursor.setAttribute("x1", view.x(at));
    cursor.setAttribute("x2", view.x(at));
    g.setAttribute("visibility", "visible");
    const parts = view.lines.map((l) => {
      const p = l.keep.find((q) => q[0] === at);
      return p ? `${l.label || l.cls} ${reading(p[1])}${view.unit}` + (state.smoothing > 0 ? ` (smoothed ${reading(p[2])})` : "") : null;
    }).filter(Boolean);
    for (const d of view.dots.filter((d) => d.step === at)) parts.push(d.title);
    if (text) text.textContent = `Step ${at}: ${parts.join("; ") || "nothing reported"}`;
  }

  // Drag across ``svg`` to show the steps under the drag; double-click to show them all; hover for the readout; the
  // keyboard as the header says.
  function zoomable(svg) {
    svg.classList.add("zoomable");
    svg.setAttribute("tabindex", "0");
    svg.setAttribute("aria-describedby", `${svg.id}-readout`);
    const text = document.createElement("p");
    text.className = "readout-text";
    text.id = `${svg.id}-readout`;
    text.setAttribute("aria-live", "polite");
    text.textContent = "Hover or focus the chart for the values at a step (Left/Right move, + and - zoom, 0 shows all).";
    svg.after(text);
    svg.readoutText = text;
    let start = null;
    const viewX = (ev) => {
      const p = svg.createSVGPoint();
      p.x = ev.clientX;
      p.y = ev.clientY;
      return p.matrixTransform(svg.getScreenCTM().inverse()).x;
    };
    const stepAt = (px) => {
      const { lo, hi } = svg.zoomRange;
      return lo + (Math.min(Math.max(px, PAD), W - PAD) - PAD) / (W - 2 * PAD) * (hi - lo);
    };
    svg.addEventListener("mousedown", (ev) => {
      if (ev.button !== 0 || !svg.zoomRange) return;
      start = viewX(ev);
      ev.preventDefault();
    });
    svg.addEventListener("mousemove", (ev) => { if (svg.zoomRange) readout(svg, stepAt(viewX(ev))); });
    window.addEventListener("mousemove", (ev) => {
      if (start === null) return;
      const band = svg.querySelector(".zoom-band"), now = viewX(ev);
      if (!band) return;
      band.setAttribute("x", Math.min(now, start));
      band.setAttribute("width", Math.abs(now - start));
      band.setAttribute("visibility", "visible");
    });
    window.addEventListener("mouseup", (ev) => {
      if (start === null) return;
      const end = viewX(ev), from = start;
      start = null;
      if (Math.abs(end - from) >= 5 && svg.zoomRange) {
        const a = Math.round(stepAt(Math.min(from, end))), b = Math.round(stepAt(Math.max(from, end)));
        state.lo = a;
        state.hi = Math.max(b, a + 1);
        state.redraw();
      } else {  // a click, not a drag: nothing redrawn, so the second click of a double-click lands on the same nodes
        svg.querySelector(".zoom-band")?.setAttribute("visibility", "hidden");
      }
    });
    svg.addEventListener("dblclick", () => {
      state.lo = state.hi = null;
      state.redraw();
    });
    svg.addEventListener("keydown", (ev) => keyboard(svg, ev));
  }

  function keyboard(svg, ev) {
    if (!svg.zoomRange) return;
    const { lo, hi } = svg.zoomRange, span = hi - lo;
    const at = svg.cursorStep ?? Math.round((lo + hi) / 2);
    if (ev.key === "ArrowLeft" || ev.key === "ArrowRight") {
      const dir = ev.key === "ArrowLeft" ? -1 : 1;
      if (ev.shiftKey) {  // pan by a quarter of the range
        const by = dir * Math.max(1, Math.round(span / 4));
        state.lo = lo + by;
        state.hi = hi + by;
        state.redraw();
      } else {
        readout(svg, at + dir);
      }
    } else if (ev.key === "+" || ev.key === "=") {
      const half = Math.max(1, Math.round(span / 4));
      state.lo = Math.max(lo, at - half);
      state.hi = Math.max(state.lo + 1, Math.min(hi, at + half));
      state.redraw();
    } else if (ev.key === "-") {
      const { min, max } = svg.allSteps;
      state.lo = Math.max(min, Math.round(lo - span / 2));
      state.hi = Math.min(max, Math.round(hi + span / 2));
      if (state.lo <= min && state.hi >= max) state.lo = state.hi = null;  // all of it: follow new steps again
      state.redraw();
    } else if (ev.key === "0" || ev.key === "Escape") {
      state.lo = state.hi = null;
      state.redraw();
    } else {
      return;
    }
    ev.preventDefault();
  }

  // The smoothing slider: its weight for every chart, kept across visits.
  function smoothingControl(input, output) {
    const saved = parseFloat(localStorage.getItem("echo2.smoothing"));
    if (saved >= 0 && saved < 1) input.value = saved;
    const apply = () => {
      state.smoothing = Math.min(Math.max(parseFloat(input.value) || 0, 0), 0.99);
      output.textContent = state.smoothing.toFixed(2);
      localStorage.setItem("echo2.smoothing", String(state.smoothing));
    };
    apply();
    input.addEventListener("input", () => { apply(); state.redraw(); });
  }

  return { state, ema, draw, zoomable, smoothingControl };
})();
