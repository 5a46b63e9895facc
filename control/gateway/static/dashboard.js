// Corral dashboard: live stats, jobs, workers, shares, the audit log and a submit form over the control
// plane's REST bridge.
//
// Every value the server sends (names, payloads, results, messages) is user-controlled, so it only
// ever reaches the page as text: through textContent, or node.append() of a string.
"use strict";

(() => {
  const PAGE_SIZE = 50; // one page of jobs is all the page ever holds
  const REFRESH_MS = 1500;
  const MAX_BACKOFF_MS = 30000;
  const AUDIT_ROWS = 20;
  /** The audit log is read every this many refreshes: it changes seldom, and its count reads a table
   * that grows for the whole retention. */
  const AUDIT_EVERY = 4;
  /** The shares are read every this many refreshes: a listing counts every queued job by owner. */
  const SHARES_EVERY = 2;
  const REQUEST_TIMEOUT_MS = 10000;
  const TOKEN_KEY = "corral.token";
  const STATES = ["SCHEDULED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"];
  const CANCELLABLE = new Set(["SCHEDULED", "PENDING", "RUNNING"]);
  const RETRYABLE = new Set(["FAILED"]);
  const NOT_DRAINABLE = new Set(["DRAINING", "UNAVAILABLE"]);
  /** The most of a followed job's output the page holds (its end): a job may print without end. */
  const LIVE_OUTPUT_CHARS = 65536;

  // ---- calls -------------------------------------------------------------------------------------

  /** The server answered with an error (a google.rpc.Status JSON); `message` is its own text. */
  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }
  /** No answer: the control plane is down, restarting, or the network is. */
  class Unreachable extends Error {}
  /** A 401: the call needs a client token, or the one given was refused. */
  class NeedsToken extends Error {}

  /** A route template of the proto annotations with its `{variables}` filled in, each escaped. */
  function routePath(template, params) {
    return template.replace(/\{(\w+)\}/g, (_, name) => encodeURIComponent(String(params[name])));
  }

  async function api(method, template, params = {}, options = {}) {
    let url = routePath(template, params);
    const query = options.query ? options.query.toString() : "";
    if (query) url += "?" + query;
    const headers = { Accept: "application/json", ...(options.headers || {}) };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    let body;
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    // The timer covers reading the body too: a half-sent answer must not hold up the refresh loop.
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), REQUEST_TIMEOUT_MS);
    let status;
    let text;
    try {
      const resp = await fetch(url, { method, headers, body, signal: abort.signal, cache: "no-store" });
      status = resp.status;
      text = await resp.text();
    } catch (err) {
      throw new Unreachable(err && err.name === "AbortError" ? "no answer within 10 s" : "the request failed");
    } finally {
      clearTimeout(timer);
    }
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    const message = data && typeof data.message === "string" ? data.message : "HTTP " + status;
    if (status === 401) {
      if (token) sessionStorage.removeItem(TOKEN_KEY); // refused: asking again beats resending it
      throw new NeedsToken(message);
    }
    // A proxy in front, or the control plane shutting down: the same to the user as no answer.
    if (status === 502 || status === 503 || status === 504) throw new Unreachable(message);
    if (status < 200 || status >= 300) throw new ApiError(status, message);
    return data;
  }

  /** Reads a server stream (newline-delimited JSON) and calls `onResult` with each message, until the
   * stream ends (returns) or fails (throws as `api` does); `signal` aborts it. No timer: it lasts as
   * long as what it follows. */
  async function stream(method, template, params, signal, onResult) {
    const headers = { Accept: "application/x-ndjson" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    let resp;
    try {
      resp = await fetch(routePath(template, params), { method, headers, signal, cache: "no-store" });
    } catch (err) {
      throw new Unreachable("the request failed");
    }
    if (resp.status === 401) throw new NeedsToken("HTTP 401");
    if (!resp.ok || !resp.body) throw new ApiError(resp.status, "HTTP " + resp.status);
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffered += value;
      let end;
      while ((end = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, end);
        buffered = buffered.slice(end + 1);
        if (!line.trim()) continue;
        const message = JSON.parse(line);
        if (message.error) throw new ApiError(0, String(message.error.message || "the stream failed"));
        if (message.result) onResult(message.result);
      }
    }
  }

  // ---- the DOM, text only ------------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  /** An element with properties, listeners and children (strings become text nodes). */
  function h(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (key === "class") node.className = value;
      else if (key === "on") for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node[key] = value;
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  function setText(id, text) {
    $(id).textContent = text;
  }

  const num = (value) => Number(value ?? 0); // int64 arrives as a string in protojson

  function parseTime(ts) {
    if (!ts) return null;
    // Nanoseconds are more than Date parses everywhere: keep milliseconds.
    const date = new Date(String(ts).replace(/(\.\d{3})\d+/, "$1"));
    return Number.isNaN(date.getTime()) ? null : date;
  }

  const pad = (n) => String(n).padStart(2, "0");

  function fmtTime(ts) {
    const d = parseTime(ts);
    if (!d) return "—";
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function queuePlace(job) {
    // "#3 · ~12.00 s": its place in the queue, and how long until its estimated start (when known).
    const at = parseTime(job.estimatedStartTime);
    const wait = at ? ` · ~${fmtSeconds(Math.max(0, (at.getTime() - Date.now()) / 1000))}` : "";
    return `#${job.queuePosition}${wait}`;
  }

  function fmtSeconds(value) {
    if (value === undefined || value === null) return "—";
    const s = Number(value);
    if (!Number.isFinite(s)) return "—";
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 0) + " ms";
    if (s < 60) return s.toFixed(2) + " s";
    if (s < 3600) return `${Math.floor(s / 60)}m ${pad(Math.floor(s % 60))}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  }

  /** How long a running job has run so far ("—" before it started): its record says 0 until it ends. */
  function fmtRunning(startedAt) {
    const d = parseTime(startedAt);
    return d ? fmtSeconds(Math.max(0, (Date.now() - d.getTime()) / 1000)) : "—";
  }

  function fmtAgo(ts) {
    const d = parseTime(ts);
    if (!d) return "—";
    return fmtSeconds(Math.max(0, (Date.now() - d.getTime()) / 1000)) + " ago";
  }

  const stateTag = (state) => h("span", { class: "state state-" + String(state) }, String(state ?? ""));

  const json = (value) => JSON.stringify(value ?? {}, null, 2);

  // ---- what the page shows -----------------------------------------------------------------------

  const view = {
    state: "",
    type: "",
    offset: 0,
    selected: null, // the id of the job in the detail panel
  };
  let lastJobs = "";
  let lastWorkers = "";
  /**
   * A section only admins may read, read every `every` refreshes: `seen` once it has answered for this
   * token (a refusal counts; until then, at every refresh), `last` what was drawn.
   */
  const adminSection = (name, every) => ({ name, every, tick: 0, seen: false, last: "" });
  const auditView = adminSection("audit", AUDIT_EVERY);
  const sharesView = adminSection("shares", SHARES_EVERY);

  /**
   * Calls `read` for `section` when its turn has come. Hides the section from a caller refused (403)
   * and shows any other error in it. Returns the answer, or null when there is nothing to draw.
   */
  async function readAdmin(section, read) {
    section.tick = (section.tick + 1) % section.every;
    if (section.tick !== 1 && section.seen) return null;
    let answer;
    try {
      answer = await read();
      section.seen = true;
    } catch (err) {
      section.seen = err instanceof ApiError;
      if (!(err instanceof ApiError)) throw err;
      $(`${section.name}-section`).hidden = err.status === 403;
      setText(`${section.name}-error`, err.status === 403 ? "" : err.message);
      return null;
    }
    $(`${section.name}-section`).hidden = false;
    setText(`${section.name}-error`, "");
    return answer;
  }

  /** Whether `text` (what a section would draw) differs from what it drew last; remembers it. */
  function changed(section, text) {
    if (text === section.last) return false;
    section.last = text;
    return true;
  }

  const jobsKey = () => JSON.stringify([view.state, view.type, view.offset]);

  async function loadStats() {
    try {
      const stats = await api("GET", "/v1/stats");
      setText("stats-error", "");
      const byStatus = stats.jobsByStatus || {};
      const cards = [
        ["Queue depth", num(stats.queueDepth)],
        ...STATES.map((s) => [s.toLowerCase(), num(byStatus[s])]),
        ["Workers", num(stats.workers)],
        // The rate is 0 over no finished job at all: say that there is none yet, not 0 %.
        ["Success rate", num(byStatus.SUCCEEDED) + num(byStatus.FAILED) > 0
          ? (Number(stats.successRate || 0) * 100).toFixed(1) + " %" : "—"],
        ["Uptime", fmtSeconds(stats.uptimeSeconds)],
      ];
      $("stats").replaceChildren(
        ...cards.map(([label, value]) =>
          h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value" }, String(value))),
        ),
      );
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      setText("stats-error", err.message);
    }
  }

  async function loadJobs() {
    const key = jobsKey();
    const listQuery = new URLSearchParams();
    // The queue view: PENDING jobs in the order workers will get them, each with its place and an
    // estimated start (shown in the Queue column instead of the time queued, which only a start fixes).
    if (view.state === "QUEUE") listQuery.set("order", "QUEUE");
    else if (view.state) listQuery.set("status", view.state);
    if (view.type) listQuery.set("type", view.type);
    listQuery.set("limit", String(PAGE_SIZE));
    listQuery.set("offset", String(view.offset));
    let page;
    try {
      page = await api("GET", "/v1/jobs", {}, { query: listQuery });
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      setText("jobs-error", err.message);
      return;
    }
    if (key !== jobsKey()) return; // the filters changed meanwhile; the next refresh fetches theirs
    setText("jobs-error", "");
    const jobs = page.jobs || [];
    const total = num(page.total);
    if (jobs.length === 0 && view.offset > 0 && total > 0) {
      // The list shrank under the current page: go to the last page that has jobs.
      view.offset = Math.floor((total - 1) / PAGE_SIZE) * PAGE_SIZE;
      refreshSoon();
      return;
    }
    setText("page-range", jobs.length
      ? `${view.offset + 1}–${view.offset + jobs.length} of ${total}`
      : `0 of ${total}`);
    $("page-prev").disabled = view.offset === 0;
    $("page-next").disabled = view.offset + jobs.length >= total;
    const text = key + JSON.stringify(jobs) + view.selected;
    if (text === lastJobs) {
      // Unchanged: keep the rows, and the user's focus and selection; only running times move on.
      for (const cell of $("jobs").querySelectorAll("td.running")) cell.textContent = fmtRunning(cell.dataset.since);
      return;
    }
    lastJobs = text;
    const focused = document.activeElement && document.activeElement.dataset
      ? document.activeElement.dataset.jobId : undefined;
    const rows = jobs.map((job) => {
      const open = h("button", {
        type: "button", class: "link mono", title: job.id, dataset: { jobId: job.id },
        on: { click: () => select(job.id) },
      }, String(job.id).slice(0, 12));
      return h("tr", { class: job.id === view.selected ? "selected" : "" },
        h("td", {}, open),
        h("td", { class: "user", title: job.name || "" }, job.name || ""),
        h("td", { class: "user" }, job.type || ""),
        h("td", {}, stateTag(job.state)),
        h("td", { class: "num" }, String(job.priority ?? 0)),
        h("td", { class: "num" }, `${job.attempts ?? 0}/${job.maxAttempts ?? 0}`),
        h("td", { class: "mono user" }, job.workerId || ""),
        h("td", { class: "user" }, job.owner || ""),
        h("td", {}, fmtTime(job.createdAt)),
        h("td", { class: "num" }, job.queuePosition ? queuePlace(job) : job.startedAt ? fmtSeconds(job.queueSeconds) : "—"),
        job.state === "RUNNING"
          ? h("td", { class: "num running", title: "running so far", dataset: { since: job.startedAt || "" } },
            fmtRunning(job.startedAt))
          : h("td", { class: "num" }, job.startedAt ? fmtSeconds(job.execSeconds) : "—"),
      );
    });
    if (rows.length === 0) rows.push(h("tr", {}, h("td", { class: "empty", colSpan: 11 }, "No jobs match.")));
    $("jobs").replaceChildren(...rows);
    if (focused) {
      const button = Array.from($("jobs").querySelectorAll("button")).find((b) => b.dataset.jobId === focused);
      if (button) button.focus();
    }
  }

  async function loadWorkers() {
    let answer;
    try {
      answer = await api("GET", "/v1/workers");
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      setText("workers-error", err.message);
      return;
    }
    const workers = answer.workers || [];
    const text = JSON.stringify(workers.map((w) => ({ ...w, lastHeartbeatAt: undefined })));
    // Heartbeats change every second; only the "ago" cells need them, so rebuild only what changed.
    if (text === lastWorkers) {
      const cells = $("workers").querySelectorAll("td.ago");
      workers.forEach((w, i) => { if (cells[i]) cells[i].textContent = fmtAgo(w.lastHeartbeatAt); });
      return;
    }
    lastWorkers = text;
    const rows = workers.map((w) => h("tr", {},
      h("td", { class: "mono user" }, w.id || ""),
      h("td", { class: "num" }, String(w.threads ?? 0)),
      h("td", { class: "num" }, `${w.freeSlots ?? 0}/${w.slots ?? 0}`),
      h("td", { class: "num" }, w.gpus ? `${w.freeGpus ?? 0}/${w.gpus}` : "—"),
      h("td", {}, stateTag(w.state)),
      h("td", { class: "user" }, ...Object.entries(w.labels || {}).map(([k, v]) => h("span", { class: "label-chip" }, `${k}=${v}`))),
      h("td", { class: "ago", title: fmtTime(w.lastHeartbeatAt) }, fmtAgo(w.lastHeartbeatAt)),
      h("td", {}, h("button", {
        type: "button", class: "danger", disabled: NOT_DRAINABLE.has(w.state),
        on: { click: (e) => drain(w.id, e.currentTarget) },
      }, "Drain")),
    ));
    if (rows.length === 0) rows.push(h("tr", {}, h("td", { class: "empty", colSpan: 8 }, "No workers registered.")));
    $("workers").replaceChildren(...rows);
  }

  /** The latest audit events; the section is hidden from a caller who may not read them (403). */
  async function loadAudit() {
    const answer = await readAdmin(auditView,
      () => api("GET", "/v1/audit", {}, { query: new URLSearchParams({ limit: String(AUDIT_ROWS) }) }));
    if (answer === null) return;
    const events = answer.events || [];
    if (!changed(auditView, JSON.stringify(events))) return;
    const rows = events.map((e) => h("tr", {},
      h("td", { title: fmtAgo(e.time) }, fmtTime(e.time)),
      h("td", { class: "user" }, e.actor || "—"),
      h("td", { class: "mono" }, e.action || ""),
      h("td", { class: "mono user" }, e.target || "—"),
      h("td", { class: e.outcome === "OK" ? "" : "error" }, e.outcome || ""),
      h("td", { class: "mono" }, e.requestId || ""),
    ));
    if (rows.length === 0) rows.push(h("tr", {}, h("td", { class: "empty", colSpan: 6 }, "Nothing recorded yet.")));
    $("audit").replaceChildren(...rows);
  }

  /** Each share in fair-share order; the section is hidden from a caller who may not read it (403). */
  async function loadShares() {
    const answer = await readAdmin(sharesView, () => api("GET", "/v1/shares"));
    if (answer === null) return;
    const listed = answer.shares || [];
    const threads = answer.connectedThreads ?? 0;
    if (!changed(sharesView, JSON.stringify([answer.halfLifeSec, threads, listed]))) return;
    // With no worker connected a dominant share counts threads held, not a part of anything.
    setText("shares-capacity", threads ? `${threads} thread${threads === 1 ? "" : "s"} connected`
      : "No worker connected: dominant shares are not known.");
    const pct = (x) => (threads ? `${((x ?? 0) * 100).toFixed(1)}%` : "—");
    const who = (name) => name || "(no token)";
    const rows = listed.map((s) => h("tr", {},
      h("td", { class: "user" }, who(s.name)),
      h("td", { class: "user" }, (s.owners || []).map(who).join(", ")),
      h("td", { class: "num" }, String(s.weight ?? 1)),
      h("td", { class: "num" }, String(s.runningJobs ?? 0)),
      h("td", { class: "num" }, String(s.queuedJobs ?? 0)),
      h("td", { class: "num" }, String(s.threads ?? 0)),
      h("td", { class: "num" }, pct(s.dominantShare)),
      h("td", { class: "num" }, answer.halfLifeSec ? pct(s.recentShare) : "—"),
      h("td", { class: "num" }, (s.rank ?? 0).toFixed(3)),
      h("td", { class: "num" }, ((s.threadSeconds ?? 0) / 3600).toFixed(2)),
    ));
    if (rows.length === 0) rows.push(h("tr", {}, h("td", { class: "empty", colSpan: 10 }, "No jobs yet.")));
    $("shares").replaceChildren(...rows);
  }

  async function loadDetail() {
    const id = view.selected;
    if (!id) return;
    let job;
    try {
      job = await api("GET", "/v1/jobs/{id}", { id });
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      if (id === view.selected) setText("detail-error", err.message);
      return;
    }
    if (id === view.selected) showJob(job);
  }

  function showJob(job) {
    setText("detail-error", "");
    setText("detail-title", "Job " + job.id);
    const err = job.error;
    const fields = [
      ["Name", job.name || "—"],
      ["Type", job.type || ""],
      ["State", stateTag(job.state)],
      ["Priority", String(job.priority ?? 0)],
      ["Attempts", attemptsText(job)],
      ["Threads", `${job.threadDemand ?? 0} asked, ${job.threadsGranted ?? 0} granted`],
      ["Holds", [job.gpuCount ? `${job.gpuCount} GPU${job.gpuCount === 1 ? "" : "s"}` : "",
                 job.memoryMb ? `${job.memoryMb} MiB` : ""].filter(Boolean).join(", ") || "—"],
      ["Timeout", fmtSeconds(job.timeoutSec)],
      ["Worker", job.workerId || "—"],
      ["Owner", job.owner || "—"],
      ["Created", fmtTime(job.createdAt)],
      ["Scheduled for", fmtTime(job.scheduledAt)],
      ["Ready at", fmtTime(job.readyAt)],
      ["Started", fmtTime(job.startedAt)],
      ["Finished", fmtTime(job.finishedAt)],
      ["Queue time", job.startedAt ? fmtSeconds(job.queueSeconds) : "—"],
      ["Exec time", job.state === "RUNNING" && job.startedAt ? fmtRunning(job.startedAt) + " so far"
        : job.startedAt ? fmtSeconds(job.execSeconds) : "—"],
      ["Total time", job.finishedAt ? fmtSeconds(job.totalSeconds) : "—"],
      ["Idempotency key", job.idempotencyKey || "—"],
      ["Labels", Object.entries(job.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "—"],
      ["Runs on", Object.entries(job.workerSelector || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "any worker"],
      ["After", (job.dependsOn || []).map((d) => ((job.waitingOn || []).includes(d) ? d + " (waiting)" : d)).join(", ") || "—"],
      ["Start when", (job.dependsOn || []).length ? job.startWhen || "ALL_SUCCEEDED" : "—"],
      ["Notify", (job.notify || []).map((n) => (n.email || n.webhookUrl) + ((n.on || []).length ? ` (${n.on.join(", ")})` : "")).join(", ") || "—"],
    ];
    $("detail-fields").replaceChildren(
      ...fields.flatMap(([label, value]) => [h("dt", {}, label), h("dd", { class: "user" }, value)]),
    );
    setText("detail-payload", json(job.payload));
    if (err && (err.code || err.message)) {
      setText("detail-outcome-title", "Error");
      setText("detail-outcome", [err.code, err.message].filter(Boolean).join(": "));
    } else {
      setText("detail-outcome-title", "Result");
      setText("detail-outcome", job.result ? json(job.result) : "—");
    }
    if (CANCELLABLE.has(job.state)) followOutput(job.id);
    else if (!live || live.id !== job.id || !live.ended) setText("detail-output", job.output || "—");
    $("detail-cancel").hidden = !CANCELLABLE.has(job.state);
    $("detail-retry").hidden = !RETRYABLE.has(job.state);
    $("detail").hidden = false;
  }

  // ---- the selected job's output, as it prints it ------------------------------------------------

  /** The WatchOutput stream of the selected job, while it has not ended: { id, abort, text, done }. */
  let live = null;

  /** Follows what job `id` prints into the Output box (once per job: a refresh does not restart it).
   * The box holds the end of it, with a line where an attempt starts and where text was left out. */
  function followOutput(id) {
    if (live && live.id === id && !live.ended) return;
    stopOutput();
    // ended: the stream reached the job's end, so its text (every attempt's) stays in the box after.
    const state = { id, abort: new AbortController(), text: "", ended: false, attempt: 0, end: 0 };
    live = state;
    setText("detail-output", "(waiting for output)");
    const add = (chunk) => {
      const attempt = num(chunk.attempt);
      const offset = num(chunk.offset);
      if (attempt !== state.attempt) {
        if (state.attempt) state.text += `--- attempt ${attempt} ---\n`;
        state.attempt = attempt;
        state.end = 0;
      }
      if (offset > state.end) state.text += `[... ${offset - state.end} characters left out]\n`;
      const text = chunk.text || "";
      state.text = (state.text + text).slice(-LIVE_OUTPUT_CHARS);
      state.end = offset + [...text].length; // offsets count code points, not UTF-16 units
      if (live === state && state.text) setText("detail-output", state.text);
    };
    stream("GET", "/v1/jobs/{id}:watchOutput", { id }, state.abort.signal, add)
      .then(() => {
        state.ended = state.text !== "";
      })
      .catch(() => {}) // stopped, or the control plane went away: the refresh shows the stored output
      .finally(() => {
        if (live !== state) return;
        live = state.ended ? state : null; // a broken stream is followed again at the next refresh
        refreshSoon();
      });
  }

  function stopOutput() {
    if (live) live.abort.abort();
    live = null;
  }

  function select(id) {
    stopOutput();
    view.selected = id;
    lastJobs = "";
    setText("detail-title", "Job " + id);
    setText("detail-error", "");
    $("detail-fields").replaceChildren();
    setText("detail-payload", "");
    setText("detail-outcome", "");
    setText("detail-output", "");
    $("detail-cancel").hidden = true;
    $("detail-retry").hidden = true;
    $("detail").hidden = false;
    $("detail").scrollIntoView({ block: "nearest" });
    refreshSoon();
  }

  // ---- actions -----------------------------------------------------------------------------------

  /** Runs a user's action; its error goes to `errorId`, verbatim, and a 401 asks for a token. */
  async function act(button, errorId, call) {
    button.disabled = true;
    setText(errorId, "");
    try {
      return await call();
    } catch (err) {
      if (err instanceof NeedsToken) askForToken(err.message);
      else if (err instanceof Unreachable) setText(errorId, "Control plane unreachable: " + err.message);
      else if (err instanceof ApiError) setText(errorId, err.message);
      else throw err;
      return undefined;
    } finally {
      button.disabled = false;
      auditView.seen = false; // the action is on record now, allowed or not: show it at the next refresh
    }
  }

  async function jobAction(buttonId, call) {
    const id = view.selected;
    if (!id) return;
    const job = await act($(buttonId), "detail-error", () => call(id));
    if (job && id === view.selected) showJob(job);
    refreshSoon();
  }

  function cancelJob() {
    if (!window.confirm(`Cancel job ${view.selected}?`)) return;
    jobAction("detail-cancel", (id) => api("POST", "/v1/jobs/{id}:cancel", { id }, { body: {} }));
  }

  function retryJob() {
    jobAction("detail-retry", (id) => api("POST", "/v1/jobs/{id}:retry", { id }, { body: {} }));
  }

  async function drain(id, button) {
    if (!window.confirm(`Drain worker ${id}? It finishes its jobs, takes no new ones, and leaves.`)) return;
    await act(button, "workers-error", () => api("POST", "/v1/workers/{id}:drain", { id }, { body: {} }));
    lastWorkers = "";
    refreshSoon();
  }

  let submitKey = null; // one key per form content: a resent submission cannot make a second job

  function newKey() {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return "ui-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  async function submitJob(event) {
    event.preventDefault();
    const form = event.currentTarget;
    const values = new FormData(form);
    setText("submit-result", "");
    setText("submit-error", "");
    let payload;
    try {
      payload = JSON.parse(String(values.get("payload") || "{}"));
    } catch (err) {
      setText("submit-error", "payload: not valid JSON (" + err.message + ")");
      return;
    }
    if (payload === null || typeof payload !== "object" || Array.isArray(payload)) {
      setText("submit-error", "payload: must be a JSON object");
      return;
    }
    const body = { type: String(values.get("type") || "").trim(), payload };
    const name = String(values.get("name") || "").trim();
    if (name) body.name = name;
    for (const field of ["priority", "threadDemand", "timeoutSec", "maxAttempts"]) {
      const raw = String(values.get(field) || "").trim();
      if (raw !== "") body[field] = Number(raw);
    }
    submitKey = submitKey || newKey();
    const answer = await act(form.querySelector("button[type=submit]"), "submit-error", () =>
      api("POST", "/v1/jobs", {}, { body, headers: { "Idempotency-Key": submitKey } }));
    if (!answer || !answer.job) return;
    submitKey = null;
    const id = answer.job.id;
    $("submit-result").replaceChildren(
      "Submitted ",
      h("button", { type: "button", class: "link mono", on: { click: () => select(id) } }, id),
    );
    refreshSoon();
  }

  // ---- the token ---------------------------------------------------------------------------------

  let awaitingToken = false;

  function askForToken(message) {
    awaitingToken = true;
    $("forget-token").hidden = true;
    setText("auth-error", message || "");
    $("auth").hidden = false;
    $("login").hidden = false;
    $("banner").hidden = true;
    setStatus("down", "needs a token");
    $("auth-token").focus();
  }

  function useToken(event) {
    event.preventDefault();
    const token = $("auth-token").value.trim();
    // fetch() refuses a header with other characters, which would look like a network failure.
    if (!/^[\x21-\x7e]+$/.test(token)) {
      setText("auth-error", "A token is printable ASCII without spaces.");
      return;
    }
    $("auth-token").value = "";
    keepToken(token);
  }

  /** Logs in to an account: its login is then the tab's token. */
  async function logIn(event) {
    event.preventDefault();
    const body = { name: $("login-name").value.trim(), password: $("login-password").value };
    let data;
    try {
      data = await api("POST", "/v1/login", {}, { body });
    } catch (err) {
      setText("auth-error", err.message);
      return;
    } finally {
      $("login-password").value = "";
    }
    keepToken(data.token);
  }

  function keepToken(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    $("auth").hidden = true;
    $("login").hidden = true;
    $("forget-token").hidden = false;
    awaitingToken = false;
    lastJobs = lastWorkers = auditView.last = sharesView.last = "";
    auditView.seen = sharesView.seen = false;
    refreshSoon();
  }

  function forgetToken() {
    sessionStorage.removeItem(TOKEN_KEY);
    $("forget-token").hidden = true;
    refreshSoon();
  }

  // ---- the refresh loop --------------------------------------------------------------------------
  // One refresh at a time: a request asked for during one runs right after it, never beside it.

  let timer = null;
  let running = false;
  let again = false;
  let failures = 0;

  function setStatus(kind, text) {
    const node = $("status");
    node.className = "status " + kind;
    node.textContent = text;
  }

  function showUnreachable(reason, delayMs) {
    const retry = h("button", { type: "button", on: { click: () => refreshSoon() } }, "Retry now");
    $("banner").replaceChildren(
      `Control plane unreachable (${reason}). Retrying in ${Math.round(delayMs / 1000)} s. `, retry,
    );
    $("banner").hidden = false;
    setStatus("down", "unreachable");
  }

  function schedule(delayMs) {
    clearTimeout(timer);
    timer = setTimeout(refresh, delayMs);
  }

  function refreshSoon() {
    if (running) again = true;
    else schedule(0);
  }

  async function refresh() {
    timer = null;
    if (document.hidden) {
      setStatus("", "paused while the tab is hidden");
      return; // visibilitychange starts it again
    }
    if (awaitingToken) return; // the token form starts it again
    running = true;
    again = false;
    const results = await Promise.allSettled([
      loadStats(), loadJobs(), loadWorkers(), loadShares(), loadAudit(), loadDetail(),
    ]);
    running = false;
    const errors = results.filter((r) => r.status === "rejected").map((r) => r.reason);
    const needsToken = errors.find((e) => e instanceof NeedsToken);
    if (needsToken) {
      askForToken(needsToken.message);
      return;
    }
    const down = errors.find((e) => e instanceof Unreachable);
    for (const e of errors) if (!(e instanceof Unreachable)) console.error(e);
    if (down) {
      failures += 1;
      const delay = Math.min(MAX_BACKOFF_MS, REFRESH_MS * 2 ** failures);
      showUnreachable(down.message, delay);
      schedule(delay);
      return;
    }
    failures = 0;
    $("banner").hidden = true;
    $("forget-token").hidden = !sessionStorage.getItem(TOKEN_KEY);
    setStatus("ok", "live · updated " + fmtTime(new Date().toISOString()).slice(11));
    schedule(again ? 0 : REFRESH_MS);
  }

  // ---- wiring ------------------------------------------------------------------------------------

  function setFilters() {
    view.state = $("filter-state").value;
    view.type = $("filter-type").value.trim();
    view.offset = 0;
    refreshSoon();
  }

  function start() {
    $("filter-state").addEventListener("change", setFilters);
    let typing = null;
    $("filter-type").addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(setFilters, 400);
    });
    $("page-prev").addEventListener("click", () => {
      view.offset = Math.max(0, view.offset - PAGE_SIZE);
      refreshSoon();
    });
    $("page-next").addEventListener("click", () => {
      view.offset += PAGE_SIZE;
      refreshSoon();
    });
    $("detail-close").addEventListener("click", () => {
      stopOutput();
      view.selected = null;
      lastJobs = "";
      $("detail").hidden = true;
      refreshSoon();
    });
    $("detail-cancel").addEventListener("click", cancelJob);
    $("detail-retry").addEventListener("click", retryJob);
    $("submit").addEventListener("submit", submitJob);
    $("submit").addEventListener("input", () => { submitKey = null; });
    $("auth").addEventListener("submit", useToken);
    $("login").addEventListener("submit", logIn);
    $("forget-token").addEventListener("click", forgetToken);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) refreshSoon();
    });
    refreshSoon();
  }

  start();
})();

// "2 of 3"; and, when some ended without being charged against the limit (handed back unfinished by a
// draining worker, or made before a retry), how many: a count past the limit otherwise reads as broken.
function attemptsText(job) {
  const attempts = job.attempts ?? 0;
  const running = job.state === "RUNNING" ? 1 : 0;
  const uncharged = Math.max(0, attempts - (job.chargedAttempts ?? 0) - running);
  const text = `${attempts} of ${job.maxAttempts ?? 0}`;
  return uncharged ? `${text} (${uncharged} not charged: handed back unfinished, or before a retry)` : text;
}

