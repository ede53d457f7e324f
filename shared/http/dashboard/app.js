// Hookwise dashboard: plain JavaScript over the public API, no dependencies.
// The API key lives in sessionStorage only; it is sent as a bearer header, never in a URL.
// At /portal it is the customer portal: its token comes after `#` in the link (so no server
// ever logs it), is moved to sessionStorage and out of the address bar at once, and the page
// carries the deployment's branding; a read-only link hides what would change anything.
"use strict";

(() => {
  const PORTAL = window.location.pathname.replace(/\/+$/, "").endsWith("/portal");
  const KEY_STORAGE = PORTAL ? "hookwise.portalToken" : "hookwise.apiKey";
  const READ_ONLY_STORAGE = "hookwise.portalReadOnly";
  const PAGE_SIZE = 20;
  const SUBS_PAGE = 20;
  const POLL_MS = 1000;

  const $ = (id) => document.getElementById(id);
  const state = {
    key: null,
    subs: [],
    subsPages: 1, // how many pages of subscriptions are shown
    subsMore: false, // whether there are more than those
    cursors: [null], // the cursor of each page seen so far; the last is the current page
    nextCursor: null,
    openId: null, // the delivery shown in detail
    openerId: null, // the button that opened it, to return focus on close
    poll: null,
    recoverPreview: null, // "<subscription>@<since>" previewed: the next submit replays
    revealsSecrets: false, // the deployment shows a signing secret again (branding.json)
    stats: new Map(), // subscription id → its open statistics panel: { window, node, seq }
  };

  // ---- API ----

  class ApiFailure extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // Relative to the page, so a path prefix (an API Gateway stage) is kept.
  const apiUrl = (path, query) => {
    const url = new URL(path, document.baseURI);
    for (const [k, v] of Object.entries(query || {})) {
      if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
    }
    return url;
  };

  async function api(method, path, { query, body } = {}) {
    const headers = { Authorization: `Bearer ${state.key}`, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let resp;
    try {
      resp = await fetch(apiUrl(path, query), {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
        credentials: "omit",
        referrerPolicy: "no-referrer",
      });
    } catch (e) {
      throw new ApiFailure(0, "network", "");
    }
    const text = await resp.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch (e) {
      json = null;
    }
    if (!resp.ok) {
      const err = (json && json.error) || {};
      throw new ApiFailure(resp.status, err.code || "", err.message || text.slice(0, 200));
    }
    return json;
  }

  /** An API failure in plain words. */
  function explain(err) {
    if (!(err instanceof ApiFailure)) return `Something went wrong in the page: ${err.message || err}`;
    const detail = err.message ? ` (${err.message})` : "";
    switch (err.status) {
      case 0:
        return "Could not reach the Hookwise API. Check that the server is running and try again.";
      case 401:
        return PORTAL
          ? "This portal link has expired or was revoked. Ask for a new link."
          : `The API key was not accepted${detail}. Enter it again.`;
      case 403:
        if (err.code === "read_only") return "This link is read-only: it cannot change anything.";
        if (err.code === "tenant_disabled") return "This account is disabled. Ask its owner.";
        return `That is not allowed${detail}.`;
      case 404:
        return `That was not found: it may have been deleted, or belong to another API key${detail}.`;
      case 409:
        return `That cannot be done right now${detail}.`;
      case 413:
        return "The request was too large.";
      case 400:
      case 422:
        return `The request was not valid${detail}.`;
      case 503:
        return "The service is briefly unavailable. Try again in a moment.";
      default:
        return `The API answered with an error (HTTP ${err.status})${detail}.`;
    }
  }

  function showError(err) {
    const box = $("alert");
    box.textContent = explain(err);
    box.hidden = false;
    if (err instanceof ApiFailure && err.status === 401) signOut(false);
  }

  function clearError() {
    $("alert").hidden = true;
    $("alert").textContent = "";
  }

  function notice(text) {
    $("notice").textContent = text;
  }

  // ---- DOM helpers (text only: API data never becomes HTML) ----

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  const cell = (label, content, cls) => el("td", { "data-label": label, class: cls }, content);
  const badge = (status) => el("span", { class: `badge ${status}` }, status);

  function time(iso) {
    if (!iso) return el("span", { class: "muted" }, "—");
    const d = new Date(iso);
    return el("time", { datetime: iso, title: iso }, d.toLocaleString());
  }

  function relative(iso) {
    if (!iso) return "—";
    const secs = Math.round((new Date(iso).getTime() - Date.now()) / 1000);
    const abs = Math.abs(secs);
    const span = abs < 90 ? `${abs} s` : abs < 5400 ? `${Math.round(abs / 60)} min` : abs < 172800 ? `${Math.round(abs / 3600)} h` : `${Math.round(abs / 86400)} days`;
    return secs >= 0 ? `in ${span}` : `${span} ago (due)`;
  }

  function policyLabel(p) {
    if (typeof p === "string") return p;
    if (!p || !Array.isArray(p.schedule_seconds)) return "custom";
    const delays = p.schedule_seconds.length ? p.schedule_seconds.map((s) => `${s}s`).join(", ") : "no retries";
    let jitter = p.jitter;
    if (jitter && typeof jitter === "object") jitter = Object.entries(jitter).map(([k, v]) => `${k} ${v}`).join("");
    return `custom: ${delays}${jitter && jitter !== "none" ? `; jitter ${jitter}` : ""}${p.adaptive ? "; adaptive" : ""}`;
  }

  /** A span of seconds in the unit that reads best: "90 s", "6 min", "2.5 h", "3.4 days". */
  function span(seconds) {
    const round1 = (n) => (Math.round(n * 10) / 10).toString();
    if (seconds < 90) return `${Math.round(seconds)} s`;
    if (seconds < 5400) return `${round1(seconds / 60)} min`;
    if (seconds < 172800) return `${round1(seconds / 3600)} h`;
    return `${round1(seconds / 86400)} days`;
  }

  // The policy's timeline, as the API computes it: "if your endpoint is down: retries at
  // +1 min, +6 min, … dead after 82.6 h".
  function scheduleLabel(s) {
    const t = s.schedule;
    if (!t) return null;
    if (!t.retries_after_seconds.length) return el("div", { class: "hint" }, "if your endpoint is down: no retries, dead at once");
    const shown = t.retries_after_seconds.slice(0, 4).map((x) => `+${span(x)}`);
    const more = t.retries_after_seconds.length > 4 ? ", …" : "";
    return el("div", { class: "hint" }, `if your endpoint is down: retries at ${shown.join(", ")}${more}; dead after ${span(t.dead_after_seconds)}`);
  }

  function healthLabel(h) {
    return h === null || h === undefined ? "no attempts yet" : `${Math.round(h * 100)} %`;
  }

  // "closed", or "open" / "half open" with when the next probe may go.
  function circuitLabel(sub) {
    const c = sub.circuit;
    if (sub.circuit_breaker && sub.circuit_breaker.enabled === false) return "off";
    if (!c || c.state === "closed") return "closed";
    const state = c.state === "half_open" ? "half open" : "open";
    const held = c.held >= 100 ? "100+ deliveries held" : `${c.held} ${c.held === 1 ? "delivery" : "deliveries"} held`;
    const since = el("div", { class: "hint" }, `since ${new Date(c.since).toLocaleTimeString()}, ${held}`);
    const probe = c.next_probe_at ? el("div", { class: "hint" }, `next probe ${relative(c.next_probe_at)}`) : null;
    return [el("span", { class: "badge dead" }, state), since, probe];
  }

  const subById = (id) => state.subs.find((s) => s.id === id);
  const subName = (id) => (subById(id) ? subById(id).url : id);

  // ---- Subscriptions ----

  // Whose deliveries these are, and whether their retries are on (and why).
  async function loadAccount() {
    const t = await api("GET", "v1/tenant");
    $("account").textContent = `${t.name} (${t.id}): retries ${t.retries.enabled ? "on" : "off"}, ${t.retries.why}.`;
  }

  async function loadSubscriptions() {
    const subs = [];
    let cursor = null;
    for (let i = 0; i < state.subsPages; i++) {
      const page = await api("GET", "v1/subscriptions", { query: { limit: SUBS_PAGE, cursor } });
      subs.push(...page.data);
      cursor = page.next_cursor;
      if (!cursor) break;
    }
    state.subs = subs;
    state.subsMore = Boolean(cursor);
    renderSubscriptions();
  }

  function isoHoursAgo(hours) {
    // The value a datetime-local input takes: local time, minutes precision.
    const d = new Date(Date.now() - hours * 3600 * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }

  function renderSubscriptions() {
    state.recoverPreview = null; // a preview stands only on the row it was shown on
    const focused = document.activeElement; // kept if it was in a statistics panel (kept too)
    for (const id of state.stats.keys()) if (!subById(id)) state.stats.delete(id);
    const body = $("subs").tBodies[0];
    body.replaceChildren();
    for (const s of state.subs) {
      const sinceId = `since-${s.id}`;
      const recover = el(
        "form",
        { class: "recover", "data-sub": s.id, onsubmit: (e) => { e.preventDefault(); recoverSince(s, $(sinceId)); } },
        el("label", { for: sinceId }, "Recover since"),
        el("input", { id: sinceId, type: "datetime-local", value: isoHoursAgo(24), required: true }),
        el("button", { type: "submit", class: "small", "aria-label": `Recover dead deliveries of ${s.url} since the time given` }, "Recover"),
        el("span", { class: "hint", "data-preview": s.id }),
      );
      const c = s.counts || {};
      body.append(
        el(
          "tr",
          { "data-sub": s.id },
          cell("Endpoint", el("span", { class: "mono" }, s.url), "url"),
          cell("Event types", [s.event_types.join(", "), s.filter ? el("div", { class: "hint mono" }, `filter ${JSON.stringify(s.filter)}`) : null]),
          cell("Policy", [policyLabel(s.retry_policy), scheduleLabel(s)]),
          cell("Rate limit", s.rate_limit_per_second ? `${s.rate_limit_per_second}/s` : "none", "num"),
          cell("Status", [badge(s.status), s.disabled_reason ? el("div", { class: "hint" }, s.disabled_reason) : null]),
          cell("Health", el("div", {}, healthLabel(s.health), el("div", {}, statsToggle(s)))),
          cell("Circuit breaker", circuitLabel(s)),
          cell("Pending", String(c.pending ?? 0), "num"),
          cell("Retrying", String(c.retrying ?? 0), "num"),
          cell("Delivered", String(c.delivered ?? 0), "num"),
          cell("Dead", String(c.dead ?? 0), "num"),
          cell("Recover", recover, "writes"),
          cell("Change", changeControls(s), "writes"),
        ),
      );
      const stats = statsRow(s);
      if (stats) body.append(stats);
    }
    refocus(focused);
    $("subs-empty").hidden = state.subs.length > 0;
    $("subs-counted").hidden = state.subs.every((s) => s.counts_complete !== false);
    $("subs-more").hidden = !state.subsMore;

    // The subscription filter lists the same subscriptions.
    const select = $("filter-sub");
    const chosen = select.value;
    select.replaceChildren(el("option", { value: "" }, "Any subscription"));
    for (const s of state.subs) select.append(el("option", { value: s.id }, s.url));
    select.value = state.subs.some((s) => s.id === chosen) ? chosen : "";
  }

  // Pause or resume, a new URL, a new secret, or delete.
  function changeControls(s) {
    const urlId = `url-${s.id}`;
    const typesId = `types-${s.id}`;
    const paused = s.status === "disabled";
    const act = (label, what, run) =>
      el("button", { type: "button", class: "small secondary", "aria-label": `${label} ${s.url}`, onclick: () => change(what, run) }, label);
    return el(
      "div",
      { class: "change" },
      el(
        "form",
        {
          class: "change",
          onsubmit: (e) => {
            e.preventDefault();
            const types = $(typesId).value.split(",").map((t) => t.trim()).filter(Boolean);
            change("The endpoint is changed.", () => patchSub(s, { url: $(urlId).value.trim(), event_types: types.length ? types : ["*"] }));
          },
        },
        el("label", { for: urlId, class: "visually-hidden" }, `New URL for ${s.url}`),
        el("input", { id: urlId, type: "url", value: s.url, spellcheck: "false" }),
        el("label", { for: typesId, class: "visually-hidden" }, `Event types for ${s.url}`),
        el("input", { id: typesId, type: "text", value: s.event_types.join(", "), spellcheck: "false" }),
        el("button", { type: "submit", class: "small" }, "Save"),
      ),
      act(paused ? "Resume" : "Pause", paused ? "Resumed." : "Paused: nothing is sent to it until it is resumed.", () =>
        patchSub(s, { status: paused ? "active" : "disabled" }),
      ),
      state.revealsSecrets
        ? act("Reveal secret", "", async () => {
            const r = await api("POST", `v1/subscriptions/${encodeURIComponent(s.id)}/reveal-secret`, { body: {} });
            showSecret(s.url, r.secret, false);
          })
        : null,
      act("Send test", "A test is on its way: it shows among the deliveries.", () =>
        api("POST", `v1/subscriptions/${encodeURIComponent(s.id)}/test`, { body: {} }),
      ),
      act("Rotate secret", "", async () => {
        const r = await api("POST", `v1/subscriptions/${encodeURIComponent(s.id)}/rotate-secret`, { body: {} });
        showSecret(s.url, r.secret, true);
      }),
      act("Delete", "Deleted.", async () => {
        if (!window.confirm(`Delete the endpoint ${s.url}? Its deliveries stop.`)) throw new Error("not deleted");
        await api("DELETE", `v1/subscriptions/${encodeURIComponent(s.id)}`);
      }),
    );
  }

  // ---- Endpoint statistics ----
  // Opened per endpoint with its Statistics button (not on page load: one request per open
  // panel), in a row under the endpoint's; the panel's node is kept across the list's renders,
  // and read again on Refresh or when its window is chosen.

  const STATS_WINDOWS = ["1h", "24h", "7d"];
  const STATS_STEP = { "1h": "5 min", "24h": "1 h", "7d": "6 h" };
  const SVG_NS = "http://www.w3.org/2000/svg";

  function statsToggle(s) {
    const open = state.stats.has(s.id);
    return el(
      "button",
      {
        type: "button",
        id: `stats-toggle-${s.id}`,
        class: "small secondary",
        "aria-label": `Statistics of ${s.url}`,
        "aria-expanded": String(open),
        "aria-controls": open ? `stats-${s.id}` : null,
        onclick: () => toggleStats(s),
      },
      "Statistics",
    );
  }

  // The row under the endpoint's that holds its open panel.
  function statsRow(s) {
    const open = state.stats.get(s.id);
    if (!open) return null;
    const columns = $("subs").tHead.rows[0].cells.length;
    return el("tr", { class: "stats-row", "data-stats-for": s.id }, el("td", { colspan: columns, class: "nolabel" }, open.node));
  }

  // A re-render moves a kept panel, which loses the focus: give it back (the toggle is new).
  function refocus(node) {
    if (!node || node === document.activeElement) return;
    if (node.isConnected && node.closest(".stats")) node.focus({ preventScroll: true });
    else if (node.id && node.id.startsWith("stats-toggle-") && $(node.id)) $(node.id).focus({ preventScroll: true });
  }

  function toggleStats(s) {
    const toggle = $(`stats-toggle-${s.id}`);
    const row = toggle.closest("tr");
    if (state.stats.has(s.id)) {
      state.stats.delete(s.id);
      const next = row.nextElementSibling;
      if (next && next.classList.contains("stats-row")) next.remove();
      toggle.setAttribute("aria-expanded", "false");
      toggle.removeAttribute("aria-controls");
      return;
    }
    state.stats.set(s.id, { window: "24h", node: statsPanel(s), seq: 0 });
    row.after(statsRow(s));
    toggle.setAttribute("aria-expanded", "true");
    toggle.setAttribute("aria-controls", `stats-${s.id}`);
    loadStats(s.id);
  }

  function statsPanel(s) {
    const windows = STATS_WINDOWS.map((w) =>
      el("button", { type: "button", class: "small secondary", "data-window": w, "aria-pressed": String(w === "24h"), onclick: () => chooseWindow(s.id, w) }, w),
    );
    return el(
      "div",
      { class: "stats", id: `stats-${s.id}`, "data-stats": s.id, role: "region", "aria-label": `Statistics of ${s.url}` },
      el(
        "div",
        { class: "stats-head" },
        el("span", { class: "stats-title" }, "Statistics"),
        el("div", { class: "stats-windows", role: "group", "aria-label": `Window of the statistics of ${s.url}` }, windows),
        el("span", { class: "hint", role: "status", "data-stats-status": "" }),
      ),
      el("div", { class: "stats-body", "data-stats-body": "" }),
    );
  }

  function chooseWindow(id, w) {
    const open = state.stats.get(id);
    if (!open) return;
    open.window = w;
    for (const b of open.node.querySelectorAll("[data-window]")) b.setAttribute("aria-pressed", String(b.dataset.window === w));
    loadStats(id);
  }

  /** Read and show one open panel's figures; an answer overtaken by a later read is dropped. */
  async function loadStats(id) {
    const open = state.stats.get(id);
    if (!open) return;
    const seq = ++open.seq;
    const current = () => state.stats.get(id) === open && open.seq === seq;
    const panel = open.node;
    const status = panel.querySelector("[data-stats-status]");
    const body = panel.querySelector("[data-stats-body]");
    panel.setAttribute("aria-busy", "true");
    status.textContent = "Loading…";
    try {
      const st = await api("GET", `v1/subscriptions/${encodeURIComponent(id)}/stats`, { query: { window: open.window } });
      if (!current()) return;
      body.replaceChildren(...statsFigures(st));
      status.textContent = "";
    } catch (e) {
      if (!current()) return;
      body.replaceChildren(el("p", { class: "alert", role: "alert", "data-stats-error": "" }, explain(e)));
      status.textContent = "";
      if (e instanceof ApiFailure && e.status === 401) showError(e);
    } finally {
      if (current()) panel.removeAttribute("aria-busy");
    }
  }

  const refreshStats = () => Promise.all([...state.stats.keys()].map(loadStats));

  const percent = (rate) => (rate === null || rate === undefined ? "— (no attempts)" : `${Math.round(rate * 1000) / 10} %`);

  // A percentile is a histogram bin's upper bound; none means above the last bin, 30 s.
  function latency(l, p) {
    if (!l) return "—";
    return l[p] === null || l[p] === undefined ? "> 30000 ms" : `${l[p]} ms`;
  }

  function failures(a) {
    const kinds = [[a.http_4xx, "HTTP 4xx"], [a.http_5xx, "HTTP 5xx"], [a.timeout, "timed out"], [a.error, "connection errors"]];
    const named = kinds.filter(([n]) => n > 0).map(([n, what]) => `${n} ${what}`);
    const total = a.total - a.succeeded;
    return named.length ? `${total} (${named.join(", ")})` : String(total);
  }

  function statsFigures(st) {
    const a = st.attempts;
    const figure = (key, label, value) => el("div", {}, el("dt", {}, label), el("dd", { "data-stat": key }, value));
    return [
      el(
        "dl",
        { class: "stats-figures" },
        figure("attempts", "Attempts", String(a.total)),
        figure("success-rate", "Success rate", percent(st.success_rate)),
        figure("failed", "Failed", failures(a)),
        figure("p50", "Latency p50", latency(st.latency_ms, "p50")),
        figure("p95", "Latency p95", latency(st.latency_ms, "p95")),
        figure("p99", "Latency p99", latency(st.latency_ms, "p99")),
        figure("dead", "Dead deliveries", String(st.dead)),
      ),
      statsChart(st),
      el(
        "div",
        { class: "stats-axis hint" },
        el("span", {}, shortTime(st.from)),
        el("span", {}, `steps of ${STATS_STEP[st.window] || st.window}`),
        el("span", {}, shortTime(st.to)),
      ),
      el(
        "ul",
        { class: "stats-legend hint" },
        el("li", {}, el("span", { class: "swatch ok" }), "succeeded"),
        el("li", {}, el("span", { class: "swatch failed" }), "failed"),
        el("li", {}, el("span", { class: "swatch dead" }), "deliveries gone dead"),
      ),
    ];
  }

  // ---- The chart: inline SVG built node by node (no markup, no styles: classes only) ----

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) node.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  const shortTime = (iso) =>
    el("time", { datetime: iso, title: iso }, new Date(iso).toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" }));

  const round2 = (n) => Math.round(n * 100) / 100;

  function stepLabel(start, w) {
    const d = new Date(start);
    const opts = w === "7d" ? { weekday: "short", hour: "2-digit", minute: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
    return d.toLocaleString([], opts);
  }

  /** Succeeded and failed attempts per step, stacked; a dot over a step where deliveries went dead. */
  function statsChart(st) {
    const W = 480;
    const H = 120;
    const TOP = 12; // room for the dead dots
    const points = st.series;
    const slot = W / Math.max(points.length, 1);
    const most = Math.max(1, ...points.map((p) => p.attempts));
    const scale = (H - TOP - 1) / most;
    const bars = points.map((p, i) => {
      const failed = Math.max(0, p.attempts - p.succeeded);
      const x = i * slot + slot * 0.15;
      const width = round2(slot * 0.7);
      const okH = p.succeeded * scale;
      const failedH = failed * scale;
      const base = H - 1;
      const top = base - okH - failedH;
      const what = `${stepLabel(p.start, st.window)}: ${p.attempts} ${p.attempts === 1 ? "attempt" : "attempts"}, ${p.succeeded} succeeded, ${failed} failed, ${p.dead} dead`;
      return svg(
        "g",
        { class: "bar", "data-start": p.start, "data-attempts": p.attempts, "data-dead": p.dead },
        svg("title", {}, what),
        svg("rect", { class: "slot", x: round2(i * slot), y: 0, width: round2(slot), height: H }),
        p.succeeded > 0 ? svg("rect", { class: "ok", x: round2(x), y: round2(base - okH), width, height: round2(okH) }) : null,
        failed > 0 ? svg("rect", { class: "failed", x: round2(x), y: round2(top), width, height: round2(failedH) }) : null,
        p.dead > 0 ? svg("circle", { class: "dead", cx: round2(i * slot + slot / 2), cy: round2(Math.max(5, top - 6)), r: 4 }) : null,
      );
    });
    const a = st.attempts;
    const label =
      `Attempts per ${STATS_STEP[st.window] || "step"} over the last ${st.window}: ${a.total} in all, ${a.succeeded} succeeded, ` +
      `${a.total - a.succeeded} failed; ${st.dead} ${st.dead === 1 ? "delivery" : "deliveries"} went dead. The tallest bar is ${most} ${most === 1 ? "attempt" : "attempts"}.`;
    return svg(
      "svg",
      { class: "stats-chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": label, "data-most": most },
      svg("title", {}, label),
      svg("line", { class: "axis", x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5 }),
      bars,
    );
  }

  const patchSub = (s, body) => api("PATCH", `v1/subscriptions/${encodeURIComponent(s.id)}`, { body });

  async function change(done, run) {
    clearError();
    try {
      await run();
      if (done) notice(done);
      await refreshAll();
    } catch (e) {
      if (e.message !== "not deleted") showError(e);
    }
  }

  function showSecret(url, secret, made) {
    $("secret-for").textContent = url;
    $("secret-value").textContent = secret;
    $("secret-made").hidden = !made;
    $("secret-box").hidden = false;
  }

  async function addSubscription() {
    clearError();
    const url = $("new-url").value.trim();
    const types = $("new-types").value.split(",").map((t) => t.trim()).filter(Boolean);
    const schedule = $("new-schedule").value.split(",").map((t) => t.trim()).filter(Boolean).map(Number);
    if (!url) {
      showError(new Error("enter the endpoint's URL"));
      $("new-url").focus();
      return;
    }
    if (schedule.some((n) => !Number.isInteger(n) || n < 1)) {
      showError(new Error("a retry schedule is whole seconds, comma-separated"));
      $("new-schedule").focus();
      return;
    }
    const body = { url, event_types: types.length ? types : ["*"] };
    const filter = $("new-filter").value.trim();
    if (filter) {
      try {
        body.filter = JSON.parse(filter);
      } catch (e) {
        showError(new Error("a content filter is a JSON object, such as {\"data\": {\"currency\": [\"EUR\"]}}"));
        $("new-filter").focus();
        return;
      }
    }
    if ($("new-policy").value) body.retry_policy = $("new-policy").value;
    if (schedule.length) body.retry_policy = { schedule_seconds: schedule };
    const rate = $("new-rate").value.trim();
    if (rate) body.rate_limit_per_second = Number(rate);
    try {
      const s = await api("POST", "v1/subscriptions", { body });
      showSecret(s.url, s.secret, true);
      notice(`Added ${s.url}.`);
      $("new-url").value = "";
      $("new-schedule").value = "";
      $("new-rate").value = "";
      $("new-filter").value = "";
      await refreshAll();
    } catch (e) {
      showError(e);
    }
  }

  async function recoverSince(sub, input) {
    clearError();
    if (!input.value) {
      showError(new Error("enter the time to recover from"));
      input.focus();
      return;
    }
    const since = new Date(input.value);
    if (Number.isNaN(since.getTime())) {
      showError(new Error(`"${input.value}" is not a date and time`));
      return;
    }
    // First a preview: how many it will replay; the second submit of the same time replays.
    const preview = document.querySelector(`[data-preview="${sub.id}"]`);
    const button = input.form.querySelector("button");
    if (state.recoverPreview !== `${sub.id}@${since.toISOString()}`) {
      try {
        const p = await api("GET", `v1/subscriptions/${encodeURIComponent(sub.id)}/recover`, { query: { since: since.toISOString() } });
        if (p.would_replay === 0) {
          notice(`No dead deliveries of ${sub.url} since ${since.toLocaleString()}.`);
          return;
        }
        state.recoverPreview = `${sub.id}@${since.toISOString()}`;
        const n = p.would_replay;
        preview.textContent = `${n} dead ${n === 1 ? "delivery" : "deliveries"} since then`;
        button.textContent = `Replay ${n}`;
        button.setAttribute("aria-label", `Replay ${n} dead ${n === 1 ? "delivery" : "deliveries"} of ${sub.url} since the time given`);
        stopPolling(); // the row stays as it is until the choice is made
        button.focus();
      } catch (e) {
        showError(e);
      }
      return;
    }
    state.recoverPreview = null;
    try {
      const r = await api("POST", `v1/subscriptions/${encodeURIComponent(sub.id)}/recover`, { body: { since: since.toISOString() } });
      const n = r.replayed.length;
      notice(n === 0 ? `No dead deliveries of ${sub.url} since ${since.toLocaleString()}.` : `Replaying ${n} dead ${n === 1 ? "delivery" : "deliveries"} of ${sub.url}.`);
      await refreshAll();
      if (n > 0) startPolling();
    } catch (e) {
      showError(e);
    }
  }

  // ---- Deliveries ----

  async function loadDeliveries() {
    const cursor = state.cursors[state.cursors.length - 1];
    const page = await api("GET", "v1/deliveries", {
      query: { status: $("filter-status").value, subscription_id: $("filter-sub").value, limit: PAGE_SIZE, cursor },
    });
    state.nextCursor = page.next_cursor;
    renderDeliveries(page.data);
  }

  function renderDeliveries(items) {
    const body = $("deliveries").tBodies[0];
    body.replaceChildren();
    for (const d of items) {
      const open = el(
        "button",
        { type: "button", class: "small secondary", id: `open-${d.id}`, "aria-label": `View delivery of ${d.event_type} (${d.status})`, onclick: () => openDelivery(d.id, `open-${d.id}`) },
        "View",
      );
      body.append(
        el(
          "tr",
          { "data-delivery": d.id, "data-status": d.status, class: d.id === state.openId ? "selected" : null },
          cell("Event type", [el("span", { class: "mono" }, d.event_type), d.test ? " " : null, d.test ? badge("test") : null]),
          cell("Created", time(d.created_at)),
          cell("Status", badge(d.status)),
          cell("Attempts", String(d.attempt_count), "num"),
          cell("Next attempt", d.next_attempt_at ? relative(d.next_attempt_at) : "—"),
          cell("Endpoint", el("span", { class: "mono" }, subName(d.subscription_id)), "url"),
          cell("Details", open, "nolabel"),
        ),
      );
    }
    $("deliveries-empty").hidden = items.length > 0;
    $("prev").disabled = state.cursors.length <= 1;
    $("next").disabled = !state.nextCursor;
    $("page-label").textContent = `Page ${state.cursors.length}`;
  }

  // ---- One delivery ----

  async function openDelivery(id, openerId) {
    clearError();
    state.openId = id;
    state.openerId = openerId || null;
    try {
      await renderDetail();
      $("detail").hidden = false;
      $("detail-title").focus();
      for (const tr of $("deliveries").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.delivery === id);
      startPolling();
    } catch (e) {
      showError(e);
    }
  }

  function closeDetail() {
    stopPolling();
    state.openId = null;
    $("detail").hidden = true;
    for (const tr of $("deliveries").tBodies[0].rows) tr.classList.remove("selected");
    const opener = state.openerId && $(state.openerId);
    if (opener) opener.focus();
  }

  /** Fetch and show the open delivery; returns its status. */
  async function renderDetail() {
    const id = state.openId;
    const d = await api("GET", `v1/deliveries/${encodeURIComponent(id)}`);
    if (state.openId !== id) return null;
    $("detail-title").textContent = `Delivery ${d.id}`;
    const status = $("detail-status");
    status.textContent = d.status;
    status.className = `badge ${d.status}`;
    $("detail-event").replaceChildren(el("span", { class: "mono" }, `${d.event_type} · ${d.event_id}`));
    $("detail-endpoint").replaceChildren(el("span", { class: "mono" }, subName(d.subscription_id)));
    $("detail-created").replaceChildren(time(d.created_at));
    $("detail-round").textContent = d.round === 0 ? "0 (original)" : `${d.round} (replay ${d.round})`;
    $("detail-next").textContent = d.next_attempt_at ? `${new Date(d.next_attempt_at).toLocaleString()} (${relative(d.next_attempt_at)})` : "—";

    const replay = $("replay");
    replay.hidden = d.status !== "dead";
    replay.disabled = false;
    $("replay-hint").textContent =
      d.status === "dead" ? "Every attempt failed. Replay makes a fresh attempt #1 now." : d.status === "delivered" ? "Delivered." : "Hookwise is still trying; this page updates by itself.";

    const body = $("attempts").tBodies[0];
    body.replaceChildren();
    for (const a of d.attempts) {
      const result = a.status_code !== null && a.status_code !== undefined ? `HTTP ${a.status_code}` : a.error || "no response";
      const ok = a.status_code >= 200 && a.status_code < 300;
      body.append(
        el(
          "tr",
          { "data-attempt": `${a.round}.${a.attempt}` },
          cell("Round", String(a.round)),
          cell("Attempt", String(a.attempt), "num"),
          cell("Started", time(a.started_at)),
          cell("Duration", `${a.duration_ms} ms`, "num"),
          cell("Result", el("span", { class: ok ? "badge delivered" : "badge dead" }, result)),
          cell("Response excerpt", el("code", { class: "excerpt" }, a.response_excerpt || "—")),
          cell("Next attempt", a.next_attempt_at ? time(a.next_attempt_at) : "—"),
          cell("Request headers", sentHeaders(a)),
        ),
      );
    }
    $("attempts-empty").hidden = d.attempts.length > 0;

    // The payload is the event's: read once per event.
    const payload = $("payload");
    if (payload.dataset.event !== d.event_id) {
      payload.textContent = "Loading…";
      try {
        const ev = await api("GET", `v1/events/${encodeURIComponent(d.event_id)}`);
        payload.textContent = JSON.stringify(ev.payload, null, 2);
        payload.dataset.event = d.event_id;
      } catch (e) {
        payload.textContent = explain(e);
      }
    }
    return d.status;
  }

  // What an attempt sent, folded away: the headers its endpoint received.
  function sentHeaders(a) {
    if (!a.request_headers) return "—";
    const lines = Object.entries(a.request_headers).map(([k, v]) => `${k}: ${v}`).join("\n");
    return el("details", {}, el("summary", {}, "Headers sent"), el("pre", { class: "payload" }, lines));
  }

  async function replayOpen() {
    clearError();
    const id = state.openId;
    const button = $("replay");
    button.disabled = true;
    try {
      const d = await api("POST", `v1/deliveries/${encodeURIComponent(id)}/replay`);
      notice(`Replay started: the delivery is ${d.status} again, with a fresh attempt #1.`);
      await renderDetail();
      await refreshLists();
      startPolling();
    } catch (e) {
      button.disabled = false;
      showError(e);
    }
  }

  // While something is in flight, follow it without a reload.
  function startPolling() {
    stopPolling();
    let last = null;
    state.poll = setInterval(async () => {
      try {
        const status = state.openId ? await renderDetail() : null;
        await refreshLists();
        if (status !== last && status) {
          if (last !== null) notice(`The delivery is now ${status}.`);
          last = status;
        }
        const busy = state.subs.some((s) => s.counts && (s.counts.pending > 0 || s.counts.retrying > 0));
        if (!busy && (status === null || status === "delivered" || status === "dead")) stopPolling();
      } catch (e) {
        stopPolling();
        showError(e);
      }
    }, POLL_MS);
  }

  function stopPolling() {
    if (state.poll) clearInterval(state.poll);
    state.poll = null;
  }

  async function refreshLists() {
    await loadSubscriptions();
    await loadDeliveries();
  }

  // The catalogue: each type's description and example (its first 100, by name), read at
  // sign-in and on Refresh, not on every poll.
  async function loadEventTypes() {
    const page = await api("GET", "v1/event-types?limit=100");
    const body = $("types").querySelector("tbody");
    body.replaceChildren(
      ...page.data.map((t) =>
        el(
          "tr",
          { "data-type": t.name },
          cell("Type", [el("span", { class: "mono" }, t.name), t.deprecated ? " " : null, t.deprecated ? badge("deprecated") : null]),
          cell("Description", [t.description || el("span", { class: "muted" }, "—"), t.schema ? el("div", { class: "hint" }, t.validate ? "payloads are checked against its schema" : "has a schema (not checked)") : null]),
          cell(
            "Example payload",
            t.example
              ? el("details", {}, el("summary", {}, "Example"), el("pre", { class: "mono" }, JSON.stringify(t.example, null, 2)))
              : el("span", { class: "muted" }, "—"),
          ),
        ),
      ),
    );
    $("types-empty").hidden = page.data.length > 0;
  }

  async function refreshAll() {
    try {
      await refreshLists();
    } catch (e) {
      showError(e);
    }
  }

  // ---- Sign in and out ----

  async function signIn(key) {
    state.key = key;
    clearError();
    state.revealsSecrets = (await deployment).reveals_secrets === true;
    try {
      await loadSubscriptions();
    } catch (e) {
      state.key = null;
      showError(e);
      return false;
    }
    sessionStorage.setItem(KEY_STORAGE, key);
    loadAccount().catch(() => {});
    loadEventTypes().catch(showError);
    $("login").hidden = true;
    $("portal-gone").hidden = true;
    $("app").hidden = false;
    $("forget").hidden = false;
    state.cursors = [null];
    state.subsPages = 1;
    await refreshAll();
    notice(PORTAL ? "Signed in. This link is kept for this tab only." : "Signed in. The key is kept for this tab only.");
    $("subs-title").setAttribute("tabindex", "-1");
    $("subs-title").focus();
    if (state.subs.some((s) => s.counts && (s.counts.pending > 0 || s.counts.retrying > 0))) startPolling();
    return true;
  }

  function signOut(announce = true) {
    stopPolling();
    sessionStorage.removeItem(KEY_STORAGE);
    state.key = null;
    state.openId = null;
    state.stats.clear();
    state.subsPages = 1;
    $("app").hidden = true;
    $("detail").hidden = true;
    $("forget").hidden = true;
    if (PORTAL) {
      // No key to type here: a portal is opened by its link.
      sessionStorage.removeItem(READ_ONLY_STORAGE);
      $("portal-gone").hidden = false;
      if (announce) notice("Signed out of the portal.");
      return;
    }
    $("login").hidden = false;
    $("api-key").value = "";
    if (announce) notice("The API key is forgotten.");
    $("api-key").focus();
  }

  // ---- The portal: its link's token, the branding ----

  /** The token and mode in the link's `#`, moved to sessionStorage and out of the address bar. */
  function takePortalLink() {
    const params = new URLSearchParams(window.location.hash.slice(1));
    const token = params.get("token");
    if (token) {
      sessionStorage.setItem(KEY_STORAGE, token);
      sessionStorage.setItem(READ_ONLY_STORAGE, params.get("read_only") === "1" ? "1" : "");
      window.history.replaceState(null, "", window.location.pathname + window.location.search);
    }
    return sessionStorage.getItem(KEY_STORAGE);
  }

  // The deployment's branding, and whether it shows a signing secret again after it is made.
  const deployment = fetch(new URL("dashboard/branding.json", document.baseURI), { cache: "no-store" })
    .then((r) => r.json())
    .catch(() => ({}));

  async function applyBranding() {
    try {
      const b = await deployment;
      if (!b.name) return;
      $("brand-name").textContent = b.name;
      document.title = `${b.name}: webhook deliveries`;
      if (b.accent) document.documentElement.style.setProperty("--accent", b.accent);
      if (b.logo) {
        $("brand-logo").src = b.logo;
        $("brand-logo").hidden = false;
      }
    } catch (e) {
      // The default look stays.
    }
  }

  // ---- Wiring ----

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const key = $("api-key").value.trim();
      if (!key) {
        showError(new Error("enter your API key first"));
        $("api-key").focus();
        return;
      }
      signIn(key);
    });
    $("forget").addEventListener("click", () => signOut(true));
    $("refresh").addEventListener("click", async () => {
      clearError();
      await refreshAll();
      await loadEventTypes().catch(showError);
      await refreshStats();
      notice("Refreshed.");
    });
    const refilter = async () => {
      state.cursors = [null];
      clearError();
      await refreshAll();
    };
    $("filter-status").addEventListener("change", refilter);
    $("filter-sub").addEventListener("change", refilter);
    $("filters").addEventListener("submit", (e) => e.preventDefault());
    $("next").addEventListener("click", async () => {
      if (!state.nextCursor) return;
      state.cursors.push(state.nextCursor);
      await refreshAll();
    });
    $("prev").addEventListener("click", async () => {
      if (state.cursors.length > 1) state.cursors.pop();
      await refreshAll();
    });
    $("subs-more").addEventListener("click", async () => {
      state.subsPages += 1;
      clearError();
      try {
        await loadSubscriptions();
      } catch (e) {
        showError(e);
      }
    });
    $("replay").addEventListener("click", replayOpen);
    $("add-sub").addEventListener("submit", (e) => {
      e.preventDefault();
      addSubscription();
    });
    $("close-detail").addEventListener("click", closeDetail);
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && !$("detail").hidden) closeDetail();
    });

    if (PORTAL) {
      $("forget").textContent = "Sign out";
      $("login").hidden = true;
      applyBranding();
      const token = takePortalLink();
      document.body.classList.toggle("read-only", sessionStorage.getItem(READ_ONLY_STORAGE) === "1");
      if (token) signIn(token);
      else $("portal-gone").hidden = false;
      return;
    }
    const saved = sessionStorage.getItem(KEY_STORAGE);
    if (saved) signIn(saved);
    else $("api-key").focus();
  });
})();
