"use strict";
// The operator page: polls GET /v1/compactgate/overview for the chosen time range and renders
// it. Every value goes in through textContent (model and tenant names come from clients).

const TOKEN_KEY = "compactgate-admin-token";
const RANGE_KEY = "compactgate-range";
const params = new URLSearchParams(location.search);
if (params.has("token")) {  // keep it for this tab, and out of the address bar and history
  sessionStorage.setItem(TOKEN_KEY, params.get("token"));
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
}
const token = sessionStorage.getItem(TOKEN_KEY);
const headers = token ? {"Authorization": "Bearer " + token} : {};
let range = sessionStorage.getItem(RANGE_KEY) || "1h";
let latest = null;  // the last overview received
let generation = 0;  // answers to an older range are dropped

// -- formatting ---------------------------------------------------------------------------------

function fmtInt(n) {
  if (n === null || n === undefined) return "–";
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return String(Math.round(n));
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms >= 1000) return (ms / 1000).toFixed(2) + " s";
  if (ms >= 10) return ms.toFixed(0) + " ms";
  return ms.toFixed(2) + " ms";
}

function fmtUsd(usd) {
  const sign = usd < 0 ? "−" : "";
  const a = Math.abs(usd);
  if (a === 0) return "$0";
  if (a < 1) return sign + "$" + a.toFixed(6);
  return sign + "$" + a.toFixed(2);
}

function fmtRate(perS) {
  if (perS >= 1) return perS.toFixed(1) + "/s";
  if (perS * 60 >= 1) return (perS * 60).toFixed(1) + "/min";
  return (perS * 3600).toFixed(1) + "/h";
}

function fmtTime(ts) {
  return new Date(ts * 1000).toLocaleTimeString();
}

// How much of a cost is known: "known", "partial" (some of the `count` items had no known
// price), or "unknown" (none had one).
function costState(unpriced, count) {
  if (count > 0 && unpriced >= count) return "unknown";
  return unpriced > 0 ? "partial" : "known";
}

// A cost: the known part, marked partial, or "unknown". Never a zero standing in for an
// unknown price.
function setCost(el, usd, state, why) {
  el.classList.remove("partial", "unknown", "negative");
  el.title = why || "";
  if (state === "unknown") {
    el.textContent = "unknown";
    el.classList.add("unknown");
    el.title = "no price is known (set models[].pricing)";
    return;
  }
  el.textContent = fmtUsd(usd);
  if (usd < 0) el.classList.add("negative");
  if (state === "partial") el.classList.add("partial");
}

// -- DOM helpers --------------------------------------------------------------------------------

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function td(text, cls, col) {
  const cell = el("td", text, cls);
  if (col) cell.dataset.col = col;
  if (col === "tenant") cell.title = text;  // long tenant names are cut short on screen
  return cell;
}

function costCell(usd, unpriced, count) {
  const cell = td("", "num", "cost");
  if (!count) {  // nothing was answered: nothing billed
    cell.textContent = "–";
    return cell;
  }
  const why = unpriced ? unpriced + " of " + count + " answered requests have no known price" : "";
  setCost(cell, usd, costState(unpriced, count), why);
  return cell;
}

function reasonsCell(row) {
  const cell = td("", "", "errors");
  cell.dataset.count = row.errors;
  if (!row.errors) {
    cell.textContent = "0";
    return cell;
  }
  const list = el("div", null, "reasons");
  for (const [reason, count] of Object.entries(row.reasons)) {
    list.appendChild(el("span", count + " × " + reason, "reason"));
  }
  cell.appendChild(list);
  return cell;
}

function fill(body, rows, columns, empty) {
  if (!rows.length) {
    const tr = el("tr");
    const cell = td(empty, "empty");
    cell.colSpan = columns;
    tr.appendChild(cell);
    body.replaceChildren(tr);
    return;
  }
  body.replaceChildren(...rows);
}

function setText(id, text) {
  document.getElementById(id).textContent = text;
}

// -- the tables ---------------------------------------------------------------------------------

// A row of a breakdown (by model, API or tenant): the key's cell, the requests, `cells`, the cost.
function breakdownRow(kind, r, keyCell, cells) {
  const tr = el("tr");
  tr.dataset[kind] = r.key;
  tr.append(
    keyCell,
    td(String(r.requests), "num", "requests"),
    ...cells,
    costCell(r.cost_usd, r.unpriced, r.answered),
  );
  return tr;
}

function modelRow(r) {
  const name = td(r.key === "-" ? "– (no model)" : r.key, "", "model");
  if (r.key === "-") name.title = "refused before a model was resolved: unknown model, bad request, or authentication";
  return breakdownRow("model", r, name, [
    td(fmtRate(r.rate_per_s), "num", "rate"),
    reasonsCell(r),
    td(fmtMs(r.p50_ms), "num", "p50"),
    td(fmtMs(r.p99_ms), "num", "p99"),
    td(fmtMs(r.overhead_p50_ms) + " / " + fmtMs(r.overhead_p99_ms), "num", "overhead"),
    td(String(r.compacted), "num", "compacted"),
    td(fmtInt(r.tokens_saved), "num", "tokens-saved"),
    td(String(r.retries), "num", "retries"),
    td(String(r.context_errors_avoided), "num", "avoided"),
    td(String(r.internal_rounds), "num", "rounds"),
  ]);
}

function apiRow(r) {
  return breakdownRow("api", r, td(r.key, "", "api"), [
    reasonsCell(r),
    td(fmtMs(r.p50_ms), "num", "p50"),
    td(fmtMs(r.p99_ms), "num", "p99"),
    td(String(r.compacted), "num", "compacted"),
    td(fmtInt(r.tokens_saved), "num", "tokens-saved"),
  ]);
}

function tenantRow(r) {
  return breakdownRow("tenant", r, td(r.key, "", "tenant"), [
    reasonsCell(r),
    td(fmtInt(r.tokens_saved), "num", "tokens-saved"),
  ]);
}

function windowRow(w) {
  const tr = el("tr");
  tr.dataset.model = w.model;
  const configured = w.configured === null ? "unknown" : fmtInt(w.configured) + " (" + w.source + ")";
  tr.append(
    td(w.model),
    td(configured, "num", "configured"),
    td(w.learned === null ? "–" : fmtInt(w.learned), w.learned === null ? "num" : "num warn", "learned"),
    td(w.effective === null ? "unknown" : fmtInt(w.effective), "num", "effective"),
  );
  return tr;
}

function requestRow(s) {
  const tr = el("tr");
  tr.dataset.request = s.request_id;
  const status = td(String(s.status), s.status < 400 ? "ok" : "bad", "status");
  if (s.reason) status.title = s.reason;
  const cost = td("", "num", "cost");
  if (s.status < 400) setCost(cost, s.cost_usd || 0, s.cost_usd === null ? "unknown" : "known");
  else cost.textContent = "–";
  tr.append(
    td(fmtTime(s.ts)),
    td(s.api, "", "api"),
    td(s.model, "", "model"),
    td(s.tenant || "-", "", "tenant"),
    status,
    td(s.tokens_before ? fmtInt(s.tokens_before) + " → " + fmtInt(s.tokens_after) : "–", "num"),
    td(s.steps === "none" ? "" : s.steps.replaceAll(",", ", "), "", "steps"),
    td(String(s.retries), "num", "retries"),
    td(fmtMs(s.total_ms), "num", "total"),
    cost,
  );
  tr.addEventListener("click", () => openRequest(s));
  return tr;
}

function eventRow(e, widest) {
  const tr = el("tr");
  tr.dataset.seq = e.seq;
  tr.append(td(fmtTime(e.ts)), td(e.api || "chat"), td(e.model + (e.mode === "observe" ? " (shadow)" : "")));
  const bars = td("", "bars");
  const before = el("div", null, "bar before");
  before.style.width = Math.max(2, 100 * e.tokens_before / widest) + "%";
  const after = el("div", null, "bar after" + (e.recovery ? " recovery" : "") + (e.mode === "observe" ? " observe" : ""));
  after.style.width = Math.max(2, 100 * e.tokens_after / widest) + "%";
  bars.append(before, after, el("div", fmtInt(e.tokens_before) + " → " + fmtInt(e.tokens_after), "muted"));
  tr.appendChild(bars);
  const phases = el("div", null, "phases");
  for (const p of e.phases) phases.appendChild(el("span", p, "phase " + p.replace(/[^a-z_]/g, "_")));
  const cell = td("");
  cell.appendChild(phases);
  tr.append(cell, td(String(e.retries), "num"), td(String(e.status)));
  tr.addEventListener("click", () => openEvent(e.seq, null));
  return tr;
}

// -- the drill-down -----------------------------------------------------------------------------

function definitions(pairs) {
  const dl = el("dl");
  for (const [name, value] of pairs) {
    if (value === undefined) continue;
    const dt = el("dt", name);
    const dd = el("dd");
    if (value instanceof Node) dd.appendChild(value);
    else dd.textContent = value === null ? "–" : String(value);
    dl.append(dt, dd);
  }
  return dl;
}

function costText(usd) {
  return usd === null || usd === undefined ? "unknown (no price known, or no usage seen)" : fmtUsd(usd);
}

function requestSection(s) {
  const agent = s.agent_compaction ? s.agent_compaction + " (" + s.agent_outcome + ")" : "not an agent's own compaction";
  return [
    el("h3", "Request"),
    definitions([
      ["request id", s.request_id],
      ["time", new Date(s.ts * 1000).toLocaleString()],
      ["api", s.api + (s.stream ? " (streamed)" : "")],
      ["model", s.model],
      ["tenant", s.tenant || "-"],
      ["status", s.status + (s.reason ? " — " + s.reason : "")],
      ["total time", fmtMs(s.total_ms)],
      ["upstream time", fmtMs(s.upstream_ms)],
      ["gateway overhead", fmtMs(s.overhead_ms)],
      ["tokens before → after", fmtInt(s.tokens_before) + " → " + fmtInt(s.tokens_after)],
      ["steps", s.steps],
      ["retries", s.retries],
      ["context errors", s.context_errors + (s.context_error_avoided ? " (recovered by a retry)" : "")],
      ["internal rounds", s.internal_rounds],
      ["cost", costText(s.cost_usd)],
      ["without the gateway", costText(s.counterfactual_usd)],
      ["saved", costText(s.saved_usd)],
      ["agent compaction", agent],
    ]),
  ];
}

function eventSection(e) {
  const nodes = [el("h3", "Compaction event #" + e.seq)];
  const phases = el("div", null, "phases");
  for (const p of e.phases) phases.appendChild(el("span", p, "phase " + p.replace(/[^a-z_]/g, "_")));
  nodes.push(definitions([
    ["mode", e.mode === "observe" ? "shadow (the original was forwarded)" : "enforce"],
    ["phases", phases],
    ["tokens before → after", fmtInt(e.tokens_before) + " → " + fmtInt(e.tokens_after)],
    ["context window / budget", fmtInt(e.context_window) + " / " + fmtInt(e.budget)],
    ["messages removed", e.messages_removed],
    ["summary used", e.summary_used ? "yes" : "no"],
    ["recovery", e.recovery || "none"],
    ["retries", e.retries],
    ["context errors", e.context_errors && e.context_errors.length ? e.context_errors.join(", ") : "none"],
    ["over the window before compaction (estimate)", e.would_have_failed ? "yes" : "no"],
    ["internal rounds", e.internal_rounds],
    ["agent compaction", e.agent_compaction ? e.agent_compaction + " (" + e.agent_outcome + (e.agent_reason ? ": " + e.agent_reason : "") + ")" : "none"],
    ["cost", costText(e.cost_usd)],
    ["without the gateway", costText(e.counterfactual_usd)],
    ["saved", costText(e.saved_usd)],
    ["total time", fmtMs(e.total_ms)],
    ["reward", e.reward],
  ]));
  nodes.push(el("h3", "Steps"));
  const table = el("table", null, "grid steps");
  const head = el("tr");
  for (const h of ["step", "tokens before → after", "removed", "replaced", "added", "summary"]) head.appendChild(el("th", h));
  table.appendChild(el("thead")).appendChild(head);
  const body = el("tbody");
  for (const step of e.steps) {
    const tr = el("tr");
    tr.dataset.step = step.type;
    tr.append(
      td(step.type),
      td(fmtInt(step.tokens_before) + " → " + fmtInt(step.tokens_after), "num"),
      td(String(step.messages_removed), "num"),
      td(String(step.messages_replaced), "num"),
      td(String(step.messages_added), "num"),
      td(step.summary_used ? "yes" : "no"),
    );
    body.appendChild(tr);
  }
  if (!e.steps.length) {
    const tr = el("tr");
    const cell = td(e.agent_compaction && !e.retries ? "not compacted here (an agent's own compaction)" : "no step changed the request (a retry only)", "empty");
    cell.colSpan = 6;
    tr.appendChild(cell);
    body.appendChild(tr);
  }
  table.appendChild(body);
  nodes.push(table);
  return nodes;
}

function showDetail(title, nodes) {
  setText("detail-title", title);
  document.getElementById("detail-body").replaceChildren(...nodes);
  document.getElementById("detail").hidden = false;
}

async function findEvent(seq) {
  const known = latest && latest.events.find(e => e.seq === seq);
  if (known) return known;
  const response = await fetch("/v1/compactgate/events?limit=500&after=" + (seq - 1), {headers});
  if (!response.ok) return null;
  const data = await response.json();
  return data.events.find(e => e.seq === seq) || null;
}

async function openEvent(seq, sample) {
  const event = await findEvent(seq);
  const nodes = sample ? requestSection(sample) : [];
  if (event) nodes.push(...eventSection(event));
  else nodes.push(el("p", "Event #" + seq + " is no longer kept in memory (events.keep).", "muted"));
  showDetail(sample ? "Request " + sample.request_id : "Compaction event #" + seq, nodes);
}

function openRequest(sample) {
  if (sample.event !== null) {
    openEvent(sample.event, sample);
    return;
  }
  const nodes = requestSection(sample);
  nodes.push(el("p", "Not compacted and not retried: forwarded as it came, so no compaction event.", "muted"));
  showDetail("Request " + sample.request_id, nodes);
}

document.getElementById("detail-close").addEventListener("click", () => {
  document.getElementById("detail").hidden = true;
});
document.addEventListener("keydown", event => {
  if (event.key === "Escape") document.getElementById("detail").hidden = true;
});

// -- rendering ----------------------------------------------------------------------------------

function render(data) {
  const view = data.overview;
  const t = view.totals;
  setText("requests-total", fmtInt(t.requests));
  setText("rate", fmtRate(t.rate_per_s));
  setText("errors", fmtInt(t.errors));
  setText("error-share", t.requests ? (100 * t.errors / t.requests).toFixed(1) + " % of requests" : "–");
  setText("compacted", fmtInt(t.compacted));
  setText("retries", t.retries + " context-error retries");
  setText("saved", fmtInt(t.tokens_saved));
  setText("avoided", fmtInt(t.context_errors_avoided));
  setText("rounds", fmtInt(t.internal_rounds));

  const c = view.costs;
  setCost(document.getElementById("cost-actual"), c.actual_usd, costState(c.unpriced, c.answered));
  setCost(document.getElementById("cost-counterfactual"), c.counterfactual_usd,
    costState(c.unpriced_counterfactual, c.answered));
  setCost(document.getElementById("cost-own"), c.own_usd, costState(c.own_unpriced, c.own_calls));
  const net = costState(Math.max(c.unpriced, c.unpriced_counterfactual), c.answered);
  setCost(document.getElementById("cost-net"), c.net_saved_usd, net === "known" && c.partial ? "partial" : net);
  setText("own-calls", c.own_calls + " summary calls" + (c.own_unpriced ? ", " + c.own_unpriced + " unpriced" : ""));
  const left = [];
  if (c.unpriced) left.push(c.unpriced + " of " + c.answered + " answered requests");
  else if (c.unpriced_counterfactual) left.push(c.unpriced_counterfactual + " of " + c.answered + " counterfactual requests");
  if (c.own_unpriced) left.push(c.own_unpriced + " of " + c.own_calls + " summary calls");
  setText("cost-note", c.partial
    ? "partial: " + left.join(" and ") + " have no known price (no usage seen, or no price for the model) and are left out"
    : c.answered + " answered requests, all priced");

  fill(document.getElementById("models"), view.models.map(modelRow), 13, "No requests in this range.");
  fill(document.getElementById("apis"), view.apis.map(apiRow), 8, "No requests in this range.");
  fill(document.getElementById("tenants"), view.tenants.map(tenantRow), 5, "No requests in this range.");
  fill(document.getElementById("windows"), data.windows.map(windowRow), 4, "No models configured.");

  const s = data.summaries;
  setText("summary-hit-rate", s.cache_hit_rate === null ? "no lookups yet"
    : (100 * s.cache_hit_rate).toFixed(1) + " % (" + s.cache_hits + " hits, " + s.cache_misses + " misses)");
  const health = document.getElementById("summariser-health");
  health.textContent = s.health + (s.failed_calls ? " (" + s.failed_calls + " failed calls)" : "");
  health.className = {healthy: "ok", degraded: "warn", failing: "bad"}[s.health] || "muted";
  const calls = Object.entries(s.calls).map(([k, v]) => v + " " + k).join(", ");
  setText("summariser-calls", calls || "none");
  setText("summariser-mean", fmtMs(s.mean_ms));

  fill(document.getElementById("requests"), data.requests.map(requestRow), 10, "No requests in this range.");
  const events = data.events.slice().reverse();
  const widest = Math.max(1, ...events.map(e => e.tokens_before));
  fill(document.getElementById("events"), events.map(e => eventRow(e, widest)), 7,
    "No compaction in this range: requests that fit are sent unchanged.");

  const covered = view.since === null || view.covered_from > view.since;
  setText("coverage", covered && data.kept.requests >= data.kept.limit
    ? "The in-memory log keeps the latest " + data.kept.limit + " requests: this range starts at " + fmtTime(view.covered_from) + "."
    : "");
  setText("status", "live · range " + data.range + " · " + data.since_start.requests + " requests since start · up "
    + Math.round(data.since_start.uptime_s) + " s · updated " + fmtTime(data.now));
}

async function refresh() {
  const asked = generation;
  try {
    const response = await fetch("/v1/compactgate/overview?range=" + encodeURIComponent(range), {headers});
    if (response.status === 401) throw new Error("the admin token is missing or wrong (open /ui?token=<token>)");
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      throw new Error(body && body.error ? body.error.message : "HTTP " + response.status);
    }
    const data = await response.json();
    if (asked !== generation) return;
    latest = data;
    render(data);
    document.body.dataset.range = data.range;
  } catch (err) {
    setText("status", "cannot read the gateway: " + err.message);
  }
}

function choose(value) {
  range = value;
  sessionStorage.setItem(RANGE_KEY, value);
  generation += 1;
  let preset = false;
  for (const button of document.querySelectorAll("#range button")) {
    button.setAttribute("aria-pressed", String(button.dataset.range === value));
    preset = preset || button.dataset.range === value;
  }
  document.getElementById("range-custom").value = preset ? "" : value;
  refresh();
}

for (const button of document.querySelectorAll("#range button")) {
  button.addEventListener("click", () => choose(button.dataset.range));
}
document.getElementById("range-form").addEventListener("submit", event => {
  event.preventDefault();  // a duration the gateway reads: 90s, 10m, 2h, 1d
  const value = document.getElementById("range-custom").value.trim();
  if (value) choose(value);
});
choose(range);
setInterval(refresh, 2000);
