// Job page: draws the charts and the forwarding chains from the rendered state, then applies each live
// update the site pushes over the job's websocket (frontend.consumers, marketplace.reads.selectors.job_live).
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

  const curves = window.Echo2Curves;

  // ---- the staleness histogram's axes and y scale (the curves are curves.js's: smoothed, zoomable)
  function frame(svg, xMax, yMax, yLabel) {
    const y = (v) => H - PAD - (H - 2 * PAD) * v / (yMax || 1);
    const out = `<line x1="${PAD}" y1="${H - PAD}" x2="${W - PAD}" y2="${H - PAD}" stroke="#999"/>` +
      `<line x1="${PAD}" y1="${PAD}" x2="${PAD}" y2="${H - PAD}" stroke="#999"/>` +
      `<text x="2" y="${PAD + 4}" font-size="10">${esc(yLabel)}</text><text x="2" y="${H - PAD}" font-size="10">0</text>`;
    return { y, out };
  }

  const steps = () => [...metrics.values()].sort((a, b) => a.step - b.step);
  const noSteps = () => (live.summary.learner_waiting ? "waiting for its learner: no step reported yet" : "no step reported yet");

  function drawReward() {
    // held-out evaluations (learner/evaluation.py) as dots at the version they scored, beside the training reward
    const evals = steps().flatMap((m) => m.eval || []).filter((e) => typeof e.pass_at_1 === "number");
    curves.draw(document.getElementById("reward-curve"), {
      series: [{ cls: "reward", color: "#1f5fbf", label: "reward", points: steps().map((m) => [m.step, m.reward_mean]) }],
      dots: evals.map((e) => ({ step: e.version, value: e.pass_at_1, cls: "eval-pass", color: "#1a7f42",
        title: `v${e.version}: held-out pass@1 ${fmt(e.pass_at_1)}` +
          `${typeof e.mean_at_k === "number" ? `, mean@${e.k} ${fmt(e.mean_at_k)}` : ""} on ${e.problems} problems` })),
      yFloor: 0, yCeil: 1, empty: noSteps() });
  }

  function drawTimes() {
    const rows = steps();
    const snaps = [...snapshots.values()].filter((s) => s.t_bcast !== null).sort((a, b) => a.version - b.version);
    curves.draw(document.getElementById("time-chart"), {
      series: [{ cls: "t-train", color: "#1f5fbf", label: "train", points: rows.map((m) => [m.step, m.t_train]) },
        { cls: "t-wait", color: "#5f6368", label: "learner wait", points: rows.map((m) => [m.step, m.wait_s]) }],
      dotLabel: "T_bcast", robust: true,
      dots: snaps.map((s) => ({ step: s.version, value: s.t_bcast, cls: "t-bcast", color: "#a3530a",
        title: `v${s.version}: T_bcast ${s.t_bcast.toFixed(3)} s, ${s.installs} installs (${s.installs_via_parent} via a chain)` })),
      unit: " s", empty: noSteps() });
    const { lo, hi } = curves.state;
    document.getElementById("zoom-range").textContent = lo === null ? "" : `Showing steps ${lo} to ${hi}.`;
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
      live.summary.published_of.startsWith("v") ? `snapshot ${live.summary.published_of}, strategy ${b.strategy}` :
        "no snapshot published yet";
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

  // Each reward function the learner scores (selectors.job_summary "reward_functions"), as the template renders it.
  function drawRewardFunctions(rows) {
    const figure = document.getElementById("reward-functions"), body = document.querySelector("#reward-functions tbody");
    if (!figure || !body || !Array.isArray(rows)) return;
    figure.hidden = !rows.length;  // a job whose workers score its whole reward has none
    body.innerHTML = rows.map((f) => `<tr data-function="${esc(f.function)}"><td><code>${esc(f.function)}</code></td>` +
      `<td class="mean">${f.mean === null ? "–" : f.mean.toFixed(3)}</td><td class="errors">${f.error_percent === null ? "–" :
        `${f.error_percent.toFixed(1)}% (${f.errors} of ${f.records})`}</td>` +
      `<td class="last-error">${esc(f.last_error || "none")}</td></tr>`).join("");
  }

  function applySummary(summary) {
    drawRewardFunctions(summary.reward_functions);
    for (const [key, value] of Object.entries(summary)) {
      if (value === undefined) continue;
      for (const el of document.querySelectorAll(`[data-key="${key}"]`)) {
        // a card never shows a bare dash where it can say why there is no value (data-null: "no cap", ...)
        el.textContent = value === null ? (el.dataset.null ?? (key === "status_reason" ? "" : "–")) : fmt(value, el.dataset.digits && +el.dataset.digits);
      }
    }
    // what shows for a running job, a finished one (final figures, no projection), one waiting for its learner
    const shown = { live: !summary.final, final: summary.final, "learner-waiting": summary.learner_waiting,
      stepped: summary.as_of_step !== null, waiting: !!summary.waiting_reason };
    for (const el of document.querySelectorAll("[data-show]")) el.hidden = !shown[el.dataset.show];
    document.getElementById("target-line").classList.toggle("error", summary.throughput_target_unmet);
    const howto = document.getElementById("export-howto"), download = document.getElementById("export");
    if (howto && download) { howto.hidden = !summary.export_line; download.hidden = !!summary.export_line; }
    const badge = document.querySelector('[data-key="status"]');
    badge.className = `badge status-${summary.waiting_reason ? "waiting" : summary.status}`;  // not green while it waits
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

  // The optimisation's series (selectors.metric_point): null where a learner did not report one (an older learner).
  const TRAINING = [["loss-chart", [["loss", "loss", "#1f5fbf"]], ""], ["kl-chart", [["kl", "KL", "#6a3d9a"]], ""],
    ["grad-norm-chart", [["grad_norm", "grad norm", "#a3530a"]], ""], ["tokens-chart", [["tokens_per_s", "tokens/s", "#05664a"]], ""],
    ["length-chart", [["completion_mean", "mean", "#1f5fbf"], ["completion_max", "longest", "#a3530a"]], ""]];

  function drawTraining() {
    const rows = steps();
    for (const [id, keys, unit] of TRAINING) {
      const series = keys.map(([key, name, color]) => ({ cls: key.replace(/_/g, "-"), color, label: name,
        points: rows.filter((m) => typeof m[key] === "number").map((m) => [m.step, m[key]]) }));
      const none = series.every((s) => !s.points.length);
      curves.draw(document.getElementById(id), { series, unit, robust: true, yFloor: Math.min(0, ...series.flatMap((s) => s.points.map((p) => p[1]))),
        empty: none && rows.length ? "not reported by this job's learner" : noSteps() });
    }
  }

  function drawAll() { drawReward(); drawTimes(); drawTraining(); drawStaleness(); drawChains(); drawWorkers(); }

  function connect(delay) {
    const proto = location.protocol === "https:" ? "wss" : "ws";
    // The site sends the learner steps after the newest one this page has (none twice, none skipped).
    const since = Math.max(0, ...metrics.keys());
    const ws = new WebSocket(`${proto}://${location.host}/ws/jobs/${jobId}/?since=${since}`);
    ws.onmessage = (ev) => { const msg = JSON.parse(ev.data); if (msg.type === "update") apply(msg); };
    ws.onopen = () => { delay = 1000; document.body.dataset.live = "connected"; };
    ws.onclose = () => { document.body.dataset.live = "reconnecting"; setTimeout(() => connect(Math.min(delay * 2, 15000)), delay); };
  }

  curves.state.redraw = () => { drawReward(); drawTimes(); drawTraining(); };
  curves.smoothingControl(document.getElementById("smoothing"), document.getElementById("smoothing-value"));
  curves.zoomable(document.getElementById("reward-curve"));
  curves.zoomable(document.getElementById("time-chart"));
  for (const [id] of TRAINING) curves.zoomable(document.getElementById(id));
  drawAll();
  connect(1000);
})();
