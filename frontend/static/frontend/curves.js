// The job page's per-step curves (job.js draws with them): each series as reported (faint) and smoothed by an
// exponential moving average, debiased as TensorBoard's smoothing slider does (bold); zoom by dragging across a chart
// to show those steps, double-click to show them all again. Every chart shares the step range and the smoothing.
// Plain SVG, no libraries.
window.Echo2Curves = (function () {
  "use strict";
  const W = 600, H = 240, PAD = 34;
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const state = { lo: null, hi: null, smoothing: 0.6, redraw: () => {} };

  // TensorBoard's: last = last * w + (1 - w) * v, divided by 1 - w^n so the first points are not pulled to 0.
  function ema(values, weight) {
    let last = 0;
    return values.map((v, i) => {
      last = last * weight + (1 - weight) * v;
      return weight > 0 ? last / (1 - weight ** (i + 1)) : v;
    });
  }

  const label = (v) => (Math.abs(v) >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toPrecision(2));

  // series: [{cls, color, points: [[step, value], ...]}] (points in step order); dots: [{step, value, cls, color,
  // title}]; yFloor / yCeil: values the y range always includes; empty: what an empty chart says.
  function draw(svg, { series, dots = [], yFloor = 0, yCeil = null, unit = "", empty = "" }) {
    const steps = [...series.flatMap((s) => s.points.map((p) => p[0])), ...dots.map((d) => d.step)];
    const axes = `<line x1="${PAD}" y1="${H - PAD}" x2="${W - PAD}" y2="${H - PAD}" stroke="#999"/>` +
      `<line x1="${PAD}" y1="${PAD}" x2="${PAD}" y2="${H - PAD}" stroke="#999"/>`;
    if (!steps.length) {
      svg.innerHTML = axes + `<text class="empty" x="${W / 2}" y="${H / 2}" font-size="12" fill="#667" text-anchor="middle">${esc(empty)}</text>`;
      svg.zoomRange = null;
      return;
    }
    let lo = state.lo ?? Math.min(...steps), hi = state.hi ?? Math.max(...steps);
    if (hi - lo < 1) hi = lo + 1;
    const inView = (step) => step >= lo && step <= hi;
    const lines = series.map((s) => {
      const smooth = ema(s.points.map((p) => p[1]), state.smoothing);
      const keep = s.points.map((p, i) => [p[0], p[1], smooth[i]]).filter((p) => inView(p[0]));
      return { ...s, keep };
    });
    const shown = [...lines.flatMap((l) => l.keep.map((p) => p[1])), ...dots.filter((d) => inView(d.step)).map((d) => d.value)];
    const yLo = Math.min(yFloor, ...shown);
    let yHi = Math.max(yCeil ?? -Infinity, ...shown);
    if (yCeil === null) yHi *= 1.1;
    if (!(yHi > yLo)) yHi = yLo + 1;
    const x = (v) => PAD + (W - 2 * PAD) * (v - lo) / (hi - lo);
    const y = (v) => H - PAD - (H - 2 * PAD) * (v - yLo) / (yHi - yLo);
    const poly = (cls, color, width, opacity, pts) => (pts.length ? `<polyline class="${cls}" fill="none" stroke="${color}" ` +
      `stroke-width="${width}" stroke-opacity="${opacity}" points="${pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ")}"/>` : "");
    let out = axes + `<text x="2" y="${PAD + 4}" font-size="10">${esc(label(yHi) + unit)}</text>` +
      `<text x="2" y="${H - PAD}" font-size="10">${esc(label(yLo))}</text>` +
      `<text class="x-lo" x="${PAD}" y="${H - PAD + 14}" font-size="10">step ${lo}</text>` +
      `<text class="x-hi" x="${W - PAD}" y="${H - PAD + 14}" font-size="10" text-anchor="end">step ${hi}</text>`;
    for (const l of lines) {
      out += poly(`raw ${l.cls}-raw`, l.color, 1, 0.35, l.keep.map((p) => [p[0], p[1]])) +
        poly(l.cls, l.color, 2, 1, l.keep.map((p) => [p[0], p[2]]));
    }
    out += dots.filter((d) => inView(d.step)).map((d) => `<circle class="${d.cls}" cx="${x(d.step)}" cy="${y(d.value)}" ` +
      `r="3.5" fill="${d.color}"><title>${esc(d.title)}</title></circle>`).join("");
    out += `<rect class="zoom-band" x="0" y="${PAD}" width="0" height="${H - 2 * PAD}" fill="#2a6fdb" fill-opacity="0.15" visibility="hidden"/>`;
    svg.innerHTML = out;
    svg.zoomRange = { lo, hi };
    svg.dataset.lo = lo;
    svg.dataset.hi = hi;
  }

  // Drag across ``svg`` to show the steps under the drag; double-click to show them all.
  function zoomable(svg) {
    svg.classList.add("zoomable");
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
      }
      state.redraw();
    });
    svg.addEventListener("dblclick", () => {
      state.lo = state.hi = null;
      state.redraw();
    });
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
