// Job page: draws the charts and the forwarding chains from the rendered state, then applies each live
// update the site pushes over the job's websocket (frontend.consumers, marketplace.selectors.job_live).
// No libraries.
(function () {
  "use strict";
  const script = document.currentScript;
  const jobId = script.dataset.job;
  const history = JSON.parse(document.getElementById("history-data").textContent);
  let live = JSON.parse(document.getElementById("live-data").textContent);
  const metrics = new Map(history.metrics.map((m) => [m.step, m]));
  const snapshots = new Map(history.snapshots.map((s) => [s.version, s]));
  const W = 600, H = 240, PAD = 34;
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const fmt = (v, digits) => (typeof v === "number" && !Number.isInteger(v) ? v.toFixed(digits ?? 3) : String(v));

  // ---- small SVG helpers: axes with a y range, and x/y scales
  function frame(svg, xMax, yMax, yLabel) {
    const x = (v) => PAD + (W - 2 * PAD) * v / Math.max(xMax, 1);
    const y = (v) => H - PAD - (H - 2 * PAD) * v / (yMax || 1);
    let out = `<line x1="${PAD}" y1="${H - PAD}" x2="${W - PAD}" y2="${H - PAD}" stroke="#999"/>` +
      `<line x1="${PAD}" y1="${PAD}" x2="${PAD}" y2="${H - PAD}" stroke="#999"/>` +
      `<text x="2" y="${PAD + 4}" font-size="10">${esc(yLabel)}</text><text x="2" y="${H - PAD}" font-size="10">0</text>`;
    return { x, y, out };
  }

  function polyline(points, color, cls) {
    if (!points.length) return "";
    return `<polyline class="${cls}" fill="none" stroke="${color}" stroke-width="2" points="${points.map((p) => p.join(",")).join(" ")}"/>`;
  }

  function drawReward() {
    const rows = [...metrics.values()].sort((a, b) => a.step - b.step);
    const maxStep = Math.max(1, ...rows.map((m) => m.step));
    const f = frame(document.getElementById("reward-curve"), maxStep, 1, "1.0");
    document.getElementById("reward-curve").innerHTML = f.out +
      `<text x="${W - PAD - 50}" y="${H - 8}" font-size="10">step ${maxStep}</text>` +
      polyline(rows.map((m) => [f.x(m.step), f.y(Math.max(0, Math.min(1, m.reward_mean)))]), "#2a6fdb", "reward");
  }

  function drawTimes() {
    const svg = document.getElementById("time-chart");
    const rows = [...metrics.values()].sort((a, b) => a.step - b.step);
    const snaps = [...snapshots.values()].filter((s) => s.t_bcast !== null).sort((a, b) => a.version - b.version);
    const maxStep = Math.max(1, ...rows.map((m) => m.step), ...snaps.map((s) => s.version));
    const yMax = Math.max(1e-3, ...rows.map((m) => Math.max(m.t_train, m.wait_s)), ...snaps.map((s) => s.t_bcast)) * 1.1;
    const f = frame(svg, maxStep, yMax, `${yMax.toPrecision(2)} s`);
    svg.innerHTML = f.out +
      `<text x="${W - PAD - 50}" y="${H - 8}" font-size="10">step ${maxStep}</text>` +
      polyline(rows.map((m) => [f.x(m.step), f.y(m.t_train)]), "#2a6fdb", "t-train") +
      polyline(rows.map((m) => [f.x(m.step), f.y(m.wait_s)]), "#aaa", "t-wait") +
      snaps.map((s) => `<circle class="t-bcast" cx="${f.x(s.version)}" cy="${f.y(s.t_bcast)}" r="3.5" fill="#d9822b">` +
        `<title>v${s.version}: T_bcast ${s.t_bcast.toFixed(3)} s, ${s.installs} installs (${s.installs_via_parent} via a chain)</title></circle>`).join("");
  }

  function drawStaleness() {
    const svg = document.getElementById("staleness-chart");
    const counts = new Map();
    for (const m of metrics.values()) {
      for (const [lag, n] of Object.entries(m.staleness_histogram || {})) counts.set(+lag, (counts.get(+lag) || 0) + n);
    }
    const S = history.staleness;
    const lags = Array.from({ length: Math.max(S, ...counts.keys()) + 1 }, (_, i) => i);
    const total = [...counts.values()].reduce((a, b) => a + b, 0);
    const yMax = Math.max(1, ...counts.values());
    const f = frame(svg, lags.length, yMax, String(yMax));
    const bw = (W - 2 * PAD) / lags.length;
    svg.innerHTML = f.out + lags.map((lag) => {
      const n = counts.get(lag) || 0, x = PAD + lag * bw;
      return `<rect class="bar" data-lag="${lag}" data-count="${n}" x="${x + 2}" y="${f.y(n)}" width="${bw - 4}" ` +
        `height="${H - PAD - f.y(n)}" fill="${lag > S ? "#b00020" : "#2a6fdb"}"><title>lag ${lag}: ${n} trajectories</title></rect>` +
        `<text x="${x + bw / 2 - 3}" y="${H - PAD + 14}" font-size="10">${lag}</text>`;
    }).join("") + `<text x="${W - PAD - 130}" y="${PAD}" font-size="10">${total} trajectories</text>`;
  }

  // ---- the forwarding chains: learner -> seed -> ... -> tail, one row per chain, then the HTTP pullers
  function drawChains() {
    const svg = document.getElementById("chain-picture");
    const b = live.broadcast;
    document.getElementById("chain-caption").textContent =
      b.version ? `snapshot v${b.version}, strategy ${b.strategy}` : "no snapshot published yet";
    const rows = b.chains.map((c) => ({ kind: "chain", nodes: c }));
    if (b.http.length) rows.push({ kind: "http", nodes: b.http });
    const NW = 120, NH = 34, GAP = 36, ROW = 56, X0 = 110;
    const width = Math.max(900, X0 + Math.max(1, ...rows.map((r) => r.nodes.length)) * (NW + GAP) + 20);
    const height = Math.max(ROW, rows.length * ROW) + 10;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.style.maxWidth = `${width}px`;
    const midY = height / 2;
    let out = `<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto">` +
      `<path d="M0,0 L10,5 L0,10 z" fill="#556"/></marker></defs>` +
      `<rect x="6" y="${midY - NH / 2}" width="84" height="${NH}" rx="6" fill="#1d2330"/>` +
      `<text x="48" y="${midY + 4}" font-size="12" fill="#fff" text-anchor="middle">learner</text>`;
    if (!rows.length) out += `<text x="${X0}" y="${midY + 4}" font-size="12" fill="#667">no active workers</text>`;
    rows.forEach((row, i) => {
      const y = i * ROW + 10 + (ROW - NH) / 2;
      const dashed = row.kind === "http" ? ' stroke-dasharray="4 3"' : "";
      out += `<path d="M90,${midY} C${X0 - 30},${midY} ${X0 - 30},${y + NH / 2} ${X0 - 2},${y + NH / 2}" fill="none" stroke="#556"${dashed} marker-end="url(#arrow)"/>`;
      if (row.kind === "http") out += `<text x="${X0 - 60}" y="${y - 2}" font-size="10" fill="#667">HTTP</text>`;
      row.nodes.forEach((n, j) => {
        const x = X0 + j * (NW + GAP);
        const behind = n.active && b.version && n.behind > 0;
        const fill = !n.active ? "#ddd" : behind ? "#f4c47a" : "#9fdcb5";
        const state = !n.active ? "released" : behind ? `${n.behind} behind` : "";
        out += `<g class="node${behind ? " behind" : ""}" data-worker="${n.id}" data-kind="${row.kind}">` +
          `<rect x="${x}" y="${y}" width="${NW}" height="${NH}" rx="6" fill="${fill}" stroke="#556"/>` +
          `<text x="${x + NW / 2}" y="${y + 14}" font-size="11" text-anchor="middle">${esc(n.name.slice(0, 18))}</text>` +
          `<text x="${x + NW / 2}" y="${y + 27}" font-size="10" text-anchor="middle">` +
          `${n.installed_version === null ? "base" : "v" + n.installed_version}${state ? ` (${state})` : ""}</text>` +
          `<title>${esc(n.name)}: installed ${n.installed_version ?? "base"}, published v${b.version}</title></g>`;
        if (row.kind === "chain" && j + 1 < row.nodes.length) {
          out += `<line x1="${x + NW}" y1="${y + NH / 2}" x2="${x + NW + GAP - 2}" y2="${y + NH / 2}" stroke="#556" marker-end="url(#arrow)"/>`;
        }
      });
    });
    svg.innerHTML = out;
  }

  function drawWorkers() {
    const body = document.querySelector("#workers tbody");
    if (!live.workers.length) { body.innerHTML = '<tr><td colspan="9">None.</td></tr>'; return; }
    body.innerHTML = live.workers.map((w) => `<tr data-worker="${w.id}"><td>${esc(w.name)}</td><td>${esc(w.gpu)}</td>` +
      `<td>${w.price_per_hour.toFixed(4)}</td><td>${w.throughput === null ? "–" : w.throughput.toFixed(1)}</td>` +
      `<td class="state state-${esc(w.state)}" title="${esc(w.state_reason)}">${esc(w.state)}</td>` +
      `<td class="version">${w.installed_version ?? "base"}</td><td>${w.behind}</td>` +
      `<td class="cost">${w.cost_usd.toFixed(4)}</td><td class="refused">${w.refused ?? 0}</td></tr>`).join("");
  }

  function applySummary(summary) {
    for (const [key, value] of Object.entries(summary)) {
      const el = document.querySelector(`[data-key="${key}"]`);
      if (!el || value === undefined) continue;
      el.textContent = value === null ? (key === "status_reason" ? "" : "–") : fmt(value, el.dataset.digits && +el.dataset.digits);
    }
    const badge = document.querySelector('[data-key="status"]');
    badge.className = `badge status-${summary.status}`;
    for (const form of document.querySelectorAll("form[data-when]")) {
      form.hidden = !form.dataset.when.split(" ").includes(summary.status);
    }
  }

  function apply(update) {
    live = update;
    applySummary(update.summary);
    for (const m of update.metrics || []) metrics.set(m.step, m);
    for (const s of update.snapshots || []) snapshots.set(s.version, s);
    drawAll();
  }

  function drawAll() { drawReward(); drawTimes(); drawStaleness(); drawChains(); drawWorkers(); }

  function connect(delay) {
    const proto = location.protocol === "https:" ? "wss" : "ws";
    // The site sends the learner steps after the newest one this page has (none twice, none skipped).
    const since = Math.max(0, ...metrics.keys());
    const ws = new WebSocket(`${proto}://${location.host}/ws/jobs/${jobId}/?since=${since}`);
    ws.onmessage = (ev) => { const msg = JSON.parse(ev.data); if (msg.type === "update") apply(msg); };
    ws.onopen = () => { delay = 1000; document.body.dataset.live = "connected"; };
    ws.onclose = () => { document.body.dataset.live = "reconnecting"; setTimeout(() => connect(Math.min(delay * 2, 15000)), delay); };
  }

  drawAll();
  connect(1000);
})();
