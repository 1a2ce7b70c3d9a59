// Keeps the launch page's capacity plan in step with the form, without a reload. After a change, the form
// is posted as a preview (what the "Preview plan" button does without JavaScript: validated like a launch,
// nothing created) and the panel is swapped for the one the server drew. The template stays the one
// renderer of the plan, and the form's mapping onto the job (task options, Mbit/s, loss_*) stays in forms.py.
(function () {
  "use strict";
  const form = document.querySelector("form.job-form");
  if (!form || !window.fetch || !window.DOMParser) return;
  let timer = null;
  let pending = null;

  async function refresh() {
    const body = new FormData(form);
    body.set("preview", "1");
    if (pending) pending.abort();
    pending = new AbortController();
    try {
      const reply = await fetch(window.location.href, {method: "POST", body, signal: pending.signal,
                                                       credentials: "same-origin"});
      if (!reply.ok) return;
      const fresh = new DOMParser().parseFromString(await reply.text(), "text/html").getElementById("plan");
      const panel = document.getElementById("plan");
      if (fresh && panel) panel.replaceWith(fresh);
    } catch (err) {
      if (err.name !== "AbortError") console.warn("plan preview failed:", err);
    }
  }

  function later() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 400);
  }

  form.addEventListener("input", later);
  form.addEventListener("change", later);
})();
