// Job page: draws the reward curve and applies live updates pushed over the job's websocket.
(function () {
  const script = document.currentScript;
  const jobId = script.dataset.job;
  const points = JSON.parse(document.getElementById("metrics-data").textContent);
  const svg = document.getElementById("reward-curve");
  const W = 600, H = 240, PAD = 30;

  function draw() {
    const maxStep = Math.max(1, ...points.map((p) => p.step));
    const xy = points.map((p) => [PAD + (W - 2 * PAD) * p.step / maxStep, H - PAD - (H - 2 * PAD) * p.reward_mean]);
    svg.innerHTML =
      `<line x1="${PAD}" y1="${H - PAD}" x2="${W - PAD}" y2="${H - PAD}" stroke="#999"/>` +
      `<line x1="${PAD}" y1="${PAD}" x2="${PAD}" y2="${H - PAD}" stroke="#999"/>` +
      `<text x="4" y="${PAD + 4}" font-size="10">1.0</text><text x="4" y="${H - PAD}" font-size="10">0</text>` +
      `<text x="${W - PAD - 40}" y="${H - 8}" font-size="10">step ${maxStep}</text>` +
      `<polyline fill="none" stroke="#2a6fdb" stroke-width="2" points="${xy.map((p) => p.join(",")).join(" ")}"/>`;
  }

  function apply(summary) {
    for (const [key, value] of Object.entries(summary)) {
      const el = document.querySelector(`[data-key="${key}"]`);
      if (!el || value === null || value === undefined) continue;
      el.textContent = typeof value === "number" && !Number.isInteger(value) ? value.toFixed(3) : value;
    }
    if (summary.reward_mean !== null && !points.some((p) => p.step === summary.step)) {
      points.push({ step: summary.step, reward_mean: summary.reward_mean });
      draw();
    }
  }

  function connect(delay) {
    const proto = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${proto}://${location.host}/ws/jobs/${jobId}/`);
    ws.onmessage = (ev) => { const msg = JSON.parse(ev.data); if (msg.type === "update") apply(msg.summary); };
    ws.onopen = () => { delay = 1000; };
    ws.onclose = () => setTimeout(() => connect(Math.min(delay * 2, 15000)), delay);
  }

  draw();
  connect(1000);
})();
