/* vecbridge console: talks to the public /v1 API only, with the key typed once per browser session.
 *
 * The key lives in sessionStorage (cleared when the tab/browser session ends), goes out only as
 * `Authorization: Bearer <key>`, and is never put in a URL, a cookie or the console log.
 * Each page is an Alpine component (registryPage, jobsPage, ...) defined below and registered with
 * Alpine.data (the end of this file). Alpine is its CSP build, so the page's Content-Security-Policy needs no
 * 'unsafe-eval': the templates' x- attributes hold only property paths and method calls of these components
 * (no operators, template strings, arrow functions or globals); whatever they show is computed here.
 */
"use strict";

const KEY_SLOT = "vecbridge.key";

const VB = {
  key() { return sessionStorage.getItem(KEY_SLOT) || ""; },
  setKey(k) { sessionStorage.setItem(KEY_SLOT, k); window.dispatchEvent(new CustomEvent("vb-key")); },
  forgetKey() { sessionStorage.removeItem(KEY_SLOT); window.dispatchEvent(new CustomEvent("vb-key")); },
  /* The service asks for keys (false: auth switched off, VECBRIDGE_AUTH_DISABLED; no key is ever needed). */
  authRequired() { return document.body.dataset.authRequired === "true"; },
  /* The path prefix a reverse proxy serves the service under ("" without one; the server's root_path): API paths
   * such as "/v1/maps" are requested below it. */
  root() { return document.body.dataset.root || ""; },
  /* A request can be answered now: a key is set, or none is needed. */
  canCall() { return !!VB.key() || !VB.authRequired(); },

  /* Seconds a request may go unanswered: then it is given up and the page says so (a poll tries again). A call
   * that may rightly take longer passes its own `timeout` (the first LM generate loads the model: ~17-30 s). */
  timeoutSeconds: 20,
  lmTimeoutSeconds: 300,

  /* Call the API; resolves to the parsed JSON (or text), rejects with {status, type, message}. `signal` (an
   * AbortSignal) gives the request up: it rejects with {aborted: true}, which a page drops (a newer one runs). */
  async api(path, { method = "GET", body = undefined, text = false, signal = undefined, timeout = undefined } = {}) {
    const headers = { Accept: text ? "text/html" : "application/json" };
    const k = VB.key();
    if (k) headers.Authorization = "Bearer " + k;
    else if (VB.authRequired()) {
      // Without a key the API can only answer 401: say so without sending the request.
      const err = { status: 401, type: "AuthenticationError", told: true,  // says what to do: no hint added
                    message: "no API key in this browser session: enter one above" };
      window.dispatchEvent(new CustomEvent("vb-401", { detail: err }));
      throw err;
    }
    if (body !== undefined) headers["Content-Type"] = "application/json";
    // a hung service left the page showing what it last read as live, and each poll added a request that never
    // ended: after timeoutSeconds the request is given up and the page says the service did not answer
    const secs = timeout === undefined ? VB.timeoutSeconds : timeout, ctl = new AbortController();
    let late = false;
    const timer = setTimeout(() => { late = true; ctl.abort(); }, secs * 1000);
    const giveUp = () => ctl.abort();
    if (signal) { if (signal.aborted) ctl.abort(); else signal.addEventListener("abort", giveUp, { once: true }); }
    const failed = (e) => {
      if (late) return { status: 0, type: "Timeout", message: `the service did not answer in ${secs} s` };
      if (ctl.signal.aborted) return { status: 0, type: "Aborted", aborted: true, message: "superseded" };
      return e;
    };
    try {
      let r;
      try {
        r = await fetch(VB.root() + path, { method, headers, signal: ctl.signal,
                                            body: body === undefined ? undefined : JSON.stringify(body) });
      } catch (e) {
        throw failed({ status: 0, type: "NetworkError", message: "the service did not answer (" + e.message + ")" });
      }
      if (r.status === 204) return null;
      if (!r.ok) {
        let err = { status: r.status, type: "HTTPError", message: r.statusText };
        try { const j = await r.json(); if (j && j.error) err = j.error; } catch (_) { /* not JSON */ }
        if (err.status === 401 || r.status === 401) window.dispatchEvent(new CustomEvent("vb-401", { detail: err }));
        throw failed(err);
      }
      try { return await (text ? r.text() : r.json()); } catch (e) { throw failed(e); }
    } finally {
      clearTimeout(timer);
      if (signal) signal.removeEventListener("abort", giveUp);
    }
  },

  /* An API error in words: what happened and what to do. */
  say(e) {
    if (!e || typeof e !== "object") return String(e);
    // an error whose message already says what to do (`told`) gets no hint: "enter one above (enter a valid API
    // key above)" said it twice
    const hint = e.told ? "" : {
      401: "enter a valid API key above",
      // the server's message names the scope (read or write) and what the key has: no guess here
      403: "use a key with the scope named",
      404: "not found",
      409: "conflicts with what is stored",
      422: "the request was refused as invalid",
      // the job queue, the language model's queue or the heavy requests' limit: the message says which
      429: "busy; try again shortly",
      503: "the service cannot do this now",
    }[e.status];
    return `${e.status || ""} ${e.type || "Error"}: ${e.message || ""}${hint ? " (" + hint + ")" : ""}`.trim();
  },

  /* A search hit in words: its payload's text (or title) when a string, else the payload as JSON, else its id. */
  label(h) {
    const p = h.payload;
    if (p === null || p === undefined) return "#" + h.id;
    if (typeof p === "string") return p;
    for (const f of ["text", "title"]) if (typeof p[f] === "string" && p[f]) return p[f];
    return JSON.stringify(p);
  },

  secs(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    if (s < 60) return s.toFixed(1) + " s";
    const m = Math.floor(s / 60);
    return m + " min " + Math.round(s - 60 * m) + " s";
  },
  num(x, d = 4) { return typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(d)) : (x ?? "–"); },
  /* Prompt + continuation as one text (a space between them unless one side already has it). */
  join(a, b) { return /\s$/.test(a) || /^\s/.test(b) || !b ? a + b : a + " " + b; },
  pct(x) { return typeof x === "number" ? (100 * x).toFixed(0) + " %" : "–"; },

  /* train_cos as the fit's own line, its report and `registry show` label it (service/figures.py): of the target's
     centred frame, the raw output's figure beside it where the version recorded one (older versions: not); a fit
     with params center=false centres nothing, its train_cos is of the raw frame. */
  trainCosLabel(m, params) {
    if (params && params.center === false) return "train_cos (raw frame: fitted with center=false)";
    const raw = m && m.train_cos_raw;
    return "train_cos " + (typeof raw === "number" && isFinite(raw) ? `(centred; raw ${raw.toFixed(4)})` : "(centred)");
  },

  /* Reliability verdict of a map version, from its metrics (MiniVec2Vec's label-free check). */
  verdict(v) {
    const m = (v && v.metrics) || {};
    const r = v && "reliable" in v ? v.reliable : m.reliable;
    if (r === true) return "reliable";
    if (r === false) return "UNRELIABLE";
    return "not checked";
  },

  /* Recall@K of a map version, one series per kind of pairs: [[k...], [{label, values}...]] (null: not measured).
     Held-out figures first (eval --record tags eval.top1 / eval.recall@10; the fit's cross-validated heldout_top1),
     then recall on the fit's own training pairs, which a map memorises (1.0 for most paired fits): not retention. */
  recallCurves(v) {
    // null / "" are figures not measured (recall@10 of at most 10 pairs is undefined: null), not 0
    const pick = (src, re) => Object.entries(src || {}).filter(([, x]) => x !== null && x !== "")
      .map(([k, x]) => [re.exec(k), Number(x)])
      .filter(([m, x]) => m && typeof x === "number" && isFinite(x)).map(([m, x]) => [Number(m[1]), x]);
    const sets = [
      ["held-out pairs (eval --record)", pick(v && v.tags, /^eval\.(?:top|recall@)(\d+)$/)],
      ["held-out pairs (the fit's own)", pick(v && v.metrics, /^heldout_top(\d+)$/)],
      ["training pairs (memorised)", pick(v && v.metrics, /^train_(?:recall@|top)(\d+)$/)],
    ].filter(([, pts]) => pts.length);
    const ks = [...new Set(sets.flatMap(([, pts]) => pts.map(p => p[0])))].sort((a, b) => a - b);
    const at = (pts, k) => (pts.find(p => p[0] === k) || [k, null])[1];
    return [ks, sets.map(([label, pts]) => ({ label, values: ks.map(k => at(pts, k)) }))];
  },

  /* Draw (or redraw) a line chart into `el`: xs, list of {label, values}. */
  chart(el, xs, series, { xlabel = "", ylabel = "", width = null, yrange = null } = {}) {
    if (!el) return;
    if (el._plot) { el._plot.destroy(); el._plot = null; }
    if (!xs.length) return;
    const colours = ["#1f5fbf", "#c0392b", "#2e8b57", "#8e44ad"];
    const w = width || Math.max(260, Math.min(560, el.clientWidth || 480));
    el._plot = new uPlot({
      width: w, height: 220,
      scales: { x: { time: false }, y: yrange ? { range: yrange } : {} },
      axes: [{ label: xlabel }, { label: ylabel }],
      series: [{ label: xlabel }, ...series.map((s, i) => ({
        label: s.label, stroke: colours[i % colours.length], width: 2, points: { show: true, size: 6 } }))],
    }, [xs, ...series.map(s => s.values)], el);
  },
};

/* The key bar in the header (every page) and the 401 panel. */
function keyBar() {
  return {
    draft: "", has: !!VB.key(), unauth: null, keyError: "",
    init() {
      window.addEventListener("vb-key", () => { this.has = !!VB.key(); this.unauth = null; });
      window.addEventListener("vb-401", (e) => { this.unauth = e.detail; });
    },
    use() {
      const k = this.draft.trim(); if (!k) return;
      // A header cannot carry other characters (fetch throws before sending, which read as "the service did
      // not answer"), and the service never issues such keys: a dash or space a word processor put in, say so.
      const bad = /[^\x20-\x7e]/.exec(k);
      this.keyError = bad ? `not an API key: keys are plain ASCII, this one has ${JSON.stringify(bad[0])} (U+${
        bad[0].codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}) at character ${bad.index + 1}` : "";
      if (bad) return;
      this.draft = ""; VB.setKey(k);
      // the key form hides once a key is set: focus went to <body>; the page's content takes it
      this.$nextTick(() => { const m = document.getElementById("main"); if (m) m.focus(); });
    },
    // Forgetting the key signs this tab out: reloaded, the page holds nothing the key let it read
    forget() { VB.forgetKey(); location.reload(); },
    // no key, or the API refused the one set (a typo, a revoked or rotated key): the field asks for another
    // auth off: there is no key to ask for (the form stayed up, and the pages' polling waited for a key)
    signedOut() { return VB.authRequired() && (!this.has || !!this.unauth); },
    keyErrorShown() { return !!this.keyError && this.signedOut(); },
    unauthMessage() { return this.unauth ? this.unauth.message : ""; },
  };
}

/* Shared page behaviour: load() on start and whenever the key changes; `error` in words. */
function page(extra) {
  return Object.assign({
    error: "", busy: false, timer: null, asking: null, polling_: false,
    init() {
      window.addEventListener("vb-key", () => this.reload());
      // a refused key (revoked, rotated) stops the polling: a new key reloads the page, which starts it again
      window.addEventListener("vb-401", () => this.stopPolling());
      this.reload();
    },
    async reload() {
      this.error = "";
      this.busy = true;
      try {
        await this.load();
        // first data on the page: a User Timing mark (read by the browser tests' render-time table)
        if (!performance.getEntriesByName("vb-data").length) this.$nextTick(() => performance.mark("vb-data"));
      } catch (e) {
        this.error = VB.say(e);
        // a page that follows jobs keeps trying after a load the service did not answer (a 401 stopped it: stays)
        if (e.status !== 401 && this.polling && this.polling()) this.startPolling();
      } finally { this.busy = false; }
    },
    /* A new request of a page's search supersedes its last one (given up): an answer arriving after a newer
       request was made is dropped, so what is shown is the answer to what was last asked. */
    supersede() {
      if (this.asking) this.asking.abort();
      this.asking = new AbortController();
      return this.asking;
    },
    latest(ctl) { return this.asking === ctl; },
    /* Pages that follow jobs (polling()) read what jobs change (follow(): all of load() unless a page says less)
       every pollEvery() ms while the tab is visible: a second while a job runs. */
    startPolling() {
      const every = this.pollEvery();
      if (this.timer && this.every === every) return;
      clearInterval(this.timer);
      this.every = every;
      this.timer = setInterval(() => this.poll(), every);
    },
    stopPolling() { clearInterval(this.timer); this.timer = null; },
    pollEvery() { return 1000; },
    follow() { return this.load(); },
    async poll() {
      // one poll at a time: an unanswered one is given up after VB.timeoutSeconds, then the next starts
      if (!VB.canCall() || document.hidden || this.polling_) return;
      this.polling_ = true;
      try { await this.follow(); this.error = ""; } catch (e) { this.error = VB.say(e); }  // a recovered poll clears it
      finally { this.polling_ = false; }
      if (!this.polling()) this.stopPolling(); else if (this.timer) this.startPolling();  // a 401 stopped it: stays
    },
    live(j) { return j.state === "queued" || j.state === "running"; },  // a job that may still change
    /* The "nothing here yet" line under a table: only once a load finished without an error. */
    showEmpty(list) { return !this.busy && !this.error && !list.length; },
    // formatting shared by the pages' templates
    num(x) { return VB.num(x); },
    pct(x) { return VB.pct(x); },
    secs(s) { return VB.secs(s); },
    dash(x) { return x === null || x === undefined || x === "" ? "–" : x; },
    json(x) { return JSON.stringify(x); },
    shortId(j) { return j.id.slice(0, 8); },
    score(h) { return h.score.toFixed(3); },
    hits(r) { return r ? r.results[0] : []; },
    label(h) { return VB.label(h); },
  }, extra);
}

function registryPage() {
  return page({
    spaces: [], maps: [], steers: [], selected: null, versions: [], version: null,
    report: "", reportNote: "", announce: "", aliasName: "prod", aliasVersion: "", aliasMsg: "", spaceMsg: "",
    confirming: "",
    async load() {
      const [s, m, t, info] = await Promise.all([VB.api("/v1/spaces"), VB.api("/v1/maps"), VB.api("/v1/steers"),
                                                 VB.api("/v1/info")]);
      this.spaces = s.data; this.maps = m.data; this.steers = t.data;
      const want = this.selected || (this.maps[0] && this.maps[0].name);
      if (want) await this.pick(want);
      // a fresh data dir registers its demo a second or so after start: look again until it is there
      if (info.demo === "preparing") setTimeout(() => this.reload(), 1000);
    },
    /* A click on a map's name: what failed in words (the tables keep the map they show). */
    /* Focus moves to the versions' heading and a polite live region says they loaded: the version buttons and
       the alias form came after every space's Delete button (1,016 Tab presses with 1,000 spaces), unannounced. */
    async choose(name) {
      try {
        await this.pick(name); this.error = "";
        const n = this.versions.length;
        this.announce = `versions of ${name} loaded: ${n} ${n === 1 ? "version" : "versions"}`;
        this.$nextTick(() => this.$refs.versionsHeading && this.$refs.versionsHeading.focus());
      } catch (e) { this.error = VB.say(e); }
    },
    async pick(name) {
      // the versions first: a failed request leaves the heading and the tables on the map they show
      const versions = (await VB.api(`/v1/maps/${encodeURIComponent(name)}/versions`)).data;
      this.selected = name;
      this.versions = versions;
      const live = this.versions.filter(v => !v.deleted);
      const last = live.length ? live[live.length - 1] : this.versions[this.versions.length - 1];
      if (last) await this.show(last.version);
    },
    async show(n) {
      this.version = this.versions.find(v => v.version === n) || null;
      // the alias form's select lists live versions only: a deleted one shown keeps the select (and what Move
      // alias sends) on a live version, the one it showed, else the latest
      const live = this.liveVersions().map(v => String(v.version));
      if (live.includes(String(n))) this.aliasVersion = String(n);
      else if (!live.includes(this.aliasVersion)) this.aliasVersion = live.length ? live[live.length - 1] : "";
      this.setReport(""); this.reportNote = "loading the fit report…";
      this.$nextTick(() => this.draw());
      if (this.version && !this.version.report_path) {  // nothing to fetch: say so instead of asking for a 404
        this.reportNote = `version ${n} has no fit report (registered without one)`;
        return;
      }
      this.loadReport(this.selected, n);  // not awaited: the tables show while the report (charts inline) loads
    },
    async loadReport(name, n) {
      try {
        const html = await VB.api(`/v1/maps/${encodeURIComponent(name)}/versions/${n}/report`, { text: true });
        if (this.selected === name && this.version && this.version.version === n) {
          this.setReport(html); this.reportNote = "";
        }
      } catch (e) { this.reportNote = VB.say(e); }
    },
    /* The report frame's document: set here, the CSP build evaluates no expression on an <iframe>. */
    setReport(html) {
      this.report = html;
      if (this.$refs.report) this.$refs.report.srcdoc = html;
    },
    draw() {
      const v = this.version; if (!v) return;
      const [ks, series] = VB.recallCurves(v);
      VB.chart(this.$refs.recall, ks, series, { xlabel: "K", ylabel: "recall@K", yrange: [0, 1] });
      const c = (v.metrics && v.metrics.criteria) || [];
      VB.chart(this.$refs.criteria, c.map((_, i) => i), [{ label: "criterion", values: c }],
        { xlabel: "restart", ylabel: "criterion" });
    },
    /* Held-out scores of every candidate family (fits with method auto): {metric, chosen, cols, rows}. */
    selection() {
      const sel = this.version && this.version.metrics && this.version.metrics.selection;
      if (!sel || !sel.candidates) return null;
      const names = Object.keys(sel.candidates);
      // cos_raw: of the raw output (train_cos is centred); records before the name held the same figure as `cos`
      const cell = (n, c) => {
        const x = sel.candidates[n];
        return c === "cos_raw" && !("cos_raw" in x) ? x.cos : x[c];
      };
      const want = ["score", "corpus_mrr", "query_mrr", "corpus_recall@1", "query_recall@1", "overlap@10", "cos_raw",
                    "seconds"];
      const cols = want.filter(c => names.some(n => typeof cell(n, c) === "number"));
      return { metric: sel.metric, chosen: sel.chosen, why: sel.why_chosen, note: sel.note, n_train: sel.n_train,
               n_holdout: sel.n_holdout, cols,
               rows: names.map(n => ({ name: n, values: cols.map(c => cell(n, c)) })) };
    },
    selectionSummary() {
      const s = this.selection();
      return `${s.metric}; ${s.n_train} pairs fitted, ${s.n_holdout} held out; chosen: ${s.chosen}` +
        (s.why ? ` (${s.why})` : "") + (s.note ? `. Note: ${s.note}` : "");
    },
    chosenClass(r) { return r.name === this.selection().chosen ? "ok" : ""; },
    candidateName(r) { return r.name + (r.name === this.selection().chosen ? " ✓" : ""); },
    /* `prod→2`, and `prod→2 (deleted)` for an alias left on a deleted version (it no longer resolves). */
    aliasesOf(m) {
      const gone = new Set(m.aliases_on_deleted || []);
      return Object.entries(m.aliases || {}).map(([a, v]) => `${a}→${v}${gone.has(a) ? " (deleted)" : ""}`)
        .join(", ") || "–";
    },
    spacesOf(m) { return `${m.source_space} → ${m.target_space}`; },
    latestOf(m) { return this.dash(m.latest_version ?? m.latest); },
    isSelected(m) { return this.selected === m.name; },
    /* The versions table: one row per version `v` of the selected map. */
    liveVersions() { return this.versions.filter(v => !v.deleted); },
    isShown(v) { return !!this.version && this.version.version === v.version; },
    showLabel(v) { return `show version ${v.version}`; },
    versionClass(v) { return v.deleted ? "muted" : ""; },
    created(v) { return (v.created_at || "").slice(0, 19).replace("T", " "); },
    versionAliases(v) { return v.aliases.join(", ") || "–"; },
    tagsOf(v) { return Object.entries(v.tags || {}).map(([k, x]) => k + "=" + x).join(", ") || "–"; },
    verdict(v) { return VB.verdict(v); },
    verdictText(v) { return v.deleted ? "deleted" : VB.verdict(v); },
    verdictTitle(v) {
      return VB.verdict(v) === "not checked"
        ? "supervised fits have no label-free reliability check; see the held-out metrics" : "";
    },
    /* The shown version's numeric metrics: [{name, value}]. */
    metricRows(v) {
      const m = (v && v.metrics) || {};
      const folded = typeof m.train_cos === "number";  // train_cos_raw is shown in train_cos's label
      return Object.entries(m).filter(([, x]) => typeof x === "number" || typeof x === "boolean")
        .filter(([name]) => !(folded && name === "train_cos_raw"))
        .map(([name, value]) => ({ name: name === "train_cos" ? VB.trainCosLabel(m, v.params) : name, value }));
    },
    /* Whether the metrics table has training-pair rows (train_*), which its caption is about: unpaired fits have
       none. */
    hasTrainRows(v) { return this.metricRows(v).some(r => r.name.startsWith("train_")); },
    lineageSpaces(v) { return `${v.source_space} (${v.source_dim}-d) → ${v.target_space} (${v.target_dim}-d)`; },
    hashesOf(v) {
      return Object.entries(v.data_hashes || {}).map(([k, h]) => k + " " + String(h).slice(0, 12)).join(", ");
    },
    hasRecall() { return VB.recallCurves(this.version)[0].length > 0; },
    hasCriteria() { const v = this.version; return !!(v && v.metrics && (v.metrics.criteria || []).length); },
    /* Delete a space in two clicks (the first asks); the service refuses one a map, steer or index uses (409,
       said in words). */
    deleteText(s) { return this.confirming === s.name ? "Confirm delete" : "Delete"; },
    deleteLabel(s) { return `${this.deleteText(s)} space ${s.name}`; },
    /* An armed Delete (it says "Confirm delete") is disarmed by Escape or by focus leaving it: it stayed armed. */
    disarm(name) { if (this.confirming === name) this.confirming = ""; },
    async deleteSpace(name) {
      if (this.confirming !== name) { this.confirming = name; this.spaceMsg = ""; return; }
      this.confirming = "";
      try {
        await VB.api(`/v1/spaces/${encodeURIComponent(name)}`, { method: "DELETE" });
        this.spaceMsg = `space ${name} deleted`;
        this.spaces = (await VB.api("/v1/spaces")).data;
      } catch (e) { this.spaceMsg = VB.say(e); }
    },
    async moveAlias() {
      this.aliasMsg = "";
      if (!this.aliasVersion) { this.aliasMsg = `${this.selected} has no live version to point an alias at`; return; }
      const n = Number(this.aliasVersion);
      try {
        const v = await VB.api(`/v1/maps/${encodeURIComponent(this.selected)}/aliases/${encodeURIComponent(this.aliasName)}`,
          { method: "PUT", body: { version: n } });
        this.aliasMsg = `alias ${this.aliasName} now points at version ${v.version}`;
        const keep = this.selected;  // that map's summary again, not every map's
        const { resolved, ...fresh } = await VB.api(`/v1/maps/${encodeURIComponent(keep)}`);
        this.maps = this.maps.map(m => (m.name === keep ? fresh : m));
        await this.pick(keep); await this.show(n);
      } catch (e) { this.aliasMsg = VB.say(e); }
    },
  });
}

/* The jobs a page shows: the newest JOBS_SHOWN (a bare GET /v1/jobs answers the newest 1,000 with their results:
   1.4-4.3 MB a poll once a long-lived service had run 1,000 fits), and the live jobs (queued, running), however many
   jobs came after them: a job running behind 50 newer ones keeps its row. A poll asks for the oldest LIVE_MAX live
   jobs (the running ones first: a queue longer than that shows its newest in the newest page, the rest in the counts);
   ENDED_KEPT jobs that ended behind the newest page keep their final row. */
const JOBS_SHOWN = 50, LIVE_MAX = 100, ENDED_KEPT = 50,
  LIVE_JOBS = `/v1/jobs?state=queued&state=running&order=oldest&limit=${LIVE_MAX}`;

/* The jobs of `lists` in one list, newest first; a job in several lists is the last list's record of it. Newest by
   `seq`, the order the jobs were made, as the service lists them: by created_at, a clock that had been ahead put the
   jobs made after it below the old ones. */
function newestFirst(...lists) {
  const byId = new Map();
  for (const list of lists) for (const j of list || []) byId.set(j.id, j);
  return [...byId.values()].sort((a, b) => b.seq - a.seq);
}

function jobsPage() {
  return page({
    jobs: [], counts: {}, cancelMsg: "", newestShown: 0,
    ended: new Map(),  // jobs older than the newest page, followed while live: their end stays shown
    async load() {
      const [j, l] = await Promise.all([VB.api(`/v1/jobs?order=newest&limit=${JOBS_SHOWN}`), VB.api(LIVE_JOBS)]);
      const known = new Set([...(j.data || []), ...(l.data || [])].map(x => x.id));
      const gone = this.jobs.filter(x => this.live(x) && !known.has(x.id) && !this.ended.has(x.id));
      const still = [];  // live, but past the LIVE_MAX the poll reads: shown as read now, read again next load
      for (const x of await Promise.all(gone.map(x => VB.api(`/v1/jobs/${x.id}`).catch(() => null)))) {
        if (x && this.live(x)) still.push(x);
        else if (x) this.ended.set(x.id, x);
      }
      const over = Math.max(0, this.ended.size - ENDED_KEPT);  // the longest-ended go first
      for (const id of [...this.ended.keys()].slice(0, over)) this.ended.delete(id);
      this.newestShown = (j.data || []).length;
      this.jobs = newestFirst(this.ended.values(), still, j.data, l.data);
      this.counts = j.counts || {};
      this.startPolling();
    },
    /* A poll reads only the jobs that may still change (queued, running: no result yet) and the counts of every
       job; the newest page again only when the counts moved (a job made, ended or trimmed, in any process) or a live
       job shown is no longer live. Idle, a poll is the counts alone (~100 bytes). A live job not shown gets its row. */
    async follow() {
      const j = await VB.api(LIVE_JOBS);
      const live = new Set((j.data || []).map(x => x.id));
      const moved = JSON.stringify(j.counts || {}) !== JSON.stringify(this.counts);
      // a shown live job missing from a full answer may only be past LIVE_MAX: the counts say when one ends
      const whole = (j.data || []).length < LIVE_MAX;
      if (moved || (whole && this.jobs.some(x => this.live(x) && !live.has(x.id)))) return this.load();
      this.jobs = newestFirst(this.jobs, j.data);
    },
    polling() { return true; },
    // every second while a job may change, else every 5 (a new job shows up then)
    pollEvery() { return this.jobs.some(j => this.live(j)) ? 1000 : 5000; },
    eta(j) {  // the current stage's (the server's estimate); the fraction is the stage's, not the job's
      return this.live(j) ? j.progress.stage_eta_seconds ?? null : null;
    },
    errorWords(j) {
      if (!j.error) return "";
      return `${j.error.type || "error"}: ${j.error.message || ""}`;
    },
    countsText() {
      const all = Object.values(this.counts).reduce((a, n) => a + n, 0);
      const older = this.jobs.length - this.newestShown;  // live (or just ended) behind the newest page
      const also = older > 0 ? `, and ${older} older ${older === 1 ? "job" : "jobs"} followed while live` : "";
      const shown = all > this.jobs.length ? ` (the newest ${this.newestShown} shown${also})` : "";
      return Object.entries(this.counts).map(([k, n]) => k + " " + n).join(" · ") + shown;
    },
    etaText(j) { return this.live(j) ? VB.secs(this.eta(j)) : "–"; },
    registered(j) {  // an unreliable fit's job succeeds too (the map is registered): the flag must show
      if (!(j.result && j.result.ref)) return "";
      const bad = j.result.version && VB.verdict(j.result.version) === "UNRELIABLE";
      const flag = bad ? " — UNRELIABLE: kept for inspection, never chosen for a path" : "";
      return "registered " + j.result.ref + flag;
    },
    progressLabel(j) { return `progress of job ${this.shortId(j)}`; },
    cancelLabel(j) { return `cancel job ${this.shortId(j)}`; },
    /* The Cancel button goes with the job's live state: focus, which fell to <body>, moves to the message. */
    async cancel(j) {
      this.cancelMsg = "";
      try {
        await VB.api(`/v1/jobs/${j.id}`, { method: "DELETE" }); this.cancelMsg = `cancel requested for ${j.id}`;
        await this.load();
      } catch (e) { this.cancelMsg = VB.say(e); }
      this.$nextTick(() => this.$refs.cancelMsg && this.$refs.cancelMsg.focus());
    },
  });
}

/* A k field's value as the search's k: an emptied field is the default 10 (Number("") sent k 0, a 422). */
function kOf(k) { return String(k === null || k === undefined ? "" : k).trim() === "" ? 10 : Number(k); }

function searchPage() {
  return page({
    indexes: [], spaces: [], index: "", space: "", query: "", k: 10, csls: false,
    native: null, mapped: null, overlap: null, searchMsg: "",
    async load() {
      const [i, s] = await Promise.all([VB.api("/v1/indexes"), VB.api("/v1/spaces")]);
      this.indexes = i.data; this.spaces = s.data;
      if (!this.index && this.indexes.length) this.index = this.indexes[0].name;
      this.pickDefaultSpace();
    },
    indexSpace() { const i = this.indexes.find(x => x.name === this.index); return i ? i.space : ""; },
    /* The query is text: only a space with an encoder can embed it (the others were listed, and refused). */
    textSpaces() { return this.spaces.filter(s => s.encoder); },
    pickDefaultSpace() {
      const own = this.indexSpace(), spaces = this.textSpaces();
      const other = spaces.find(s => s.name !== own), mine = spaces.find(s => s.name === own);
      if (!this.space || this.space === own) this.space = other ? other.name : mine ? own : "";
    },
    /* What the results shown answer (index, both spaces, k): their headings say it, not the form's current
       values (a changed dropdown relabelled the old hits); `stale` once the form no longer asks that. */
    asked: null, stale: false,
    async run() {
      const ctl = this.supersede();
      this.searchMsg = ""; this.native = this.mapped = null; this.overlap = null; this.asked = null; this.stale = false;
      this.busy = false;  // a search given up above ends here, not in its own finally
      if (!this.index) { this.searchMsg = "no index to search yet: create one (POST /v1/indexes, API docs)"; return; }
      if (!this.query.trim()) { this.searchMsg = "type a query first"; return; }
      if (!this.space) {
        this.searchMsg = "no space has an encoder to embed the query (POST /v1/spaces with one)";
        return;
      }
      const asked = { index: this.index, native: this.indexSpace(), space: this.space, k: kOf(this.k) };
      const base = { texts: [this.query], k: asked.k, csls: this.csls, include_payloads: true };
      const url = `/v1/indexes/${encodeURIComponent(asked.index)}/search`;
      const ask = (space) => VB.api(url, { method: "POST", body: { ...base, space }, signal: ctl.signal });
      this.busy = true;
      try {
        const [a, b] = await Promise.allSettled([ask(asked.native), ask(asked.space)]);
        if (!this.latest(ctl)) return;  // a newer search was asked for: its answer is the one shown
        if (a.status === "fulfilled") this.native = a.value; else this.searchMsg = "native: " + VB.say(a.reason);
        if (b.status === "fulfilled") this.mapped = b.value;
        else this.searchMsg = (this.searchMsg ? this.searchMsg + "; " : "") + "through the map: " + VB.say(b.reason);
        if (this.native || this.mapped) this.asked = asked;
        if (this.native && this.mapped) {
          const top = (r) => new Set(r.results[0].map(h => h.id));
          const A = top(this.native), B = top(this.mapped);
          let n = 0; A.forEach(x => { if (B.has(x)) n++; });
          this.overlap = { shared: n, of: Math.min(A.size, B.size) };
        }
      } finally { if (this.latest(ctl)) this.busy = false; }
    },
    /* An input changed since the results shown were asked for: they are marked as the last search's. Also while
       a search is on its way (its answer then comes marked: it answers the form as it was when Search was pressed). */
    changed() { if (this.asked || this.busy) this.stale = true; },
    indexChanged() { this.pickDefaultSpace(); this.changed(); },
    staleText() {
      const a = this.asked;
      return a ? `The results below answer the last search (index ${a.index}, query's model ${a.space}, k = ${a.k}),` +
        " not the form as it is now: press Search to run it." : "";
    },
    searchText() { return this.busy ? "Searching…" : "Search"; },
    indexOption(i) { return `${i.name} (${i.space}, ${i.count} rows)`; },
    spaceOption(s) { return s.encoder ? `${s.name} · ${s.encoder}` : s.name; },
    /* A search refused by the browser (k out of 1-100): the error of an earlier search no longer answers the form,
       and the browser's own bubble says what is wrong. */
    invalid() { this.searchMsg = ""; },
    nativeSpace() { return this.native ? this.native.query_space : this.asked ? this.asked.native : ""; },
    mappedSpace() { return this.mapped ? this.mapped.query_space : this.asked ? this.asked.space : ""; },
    resultsIndex() { return this.asked ? this.asked.index : ""; },
    // the overlap of the two lists of k hits shown (it said overlap@10 for any k)
    overlapLabel() { return this.overlap ? `overlap@${this.asked.k}:` : ""; },
    overlapText() { return this.overlap ? `${this.overlap.shared} / ${this.overlap.of}` : ""; },
    bothText(h, r) { return this.sharedClass(h, r) ? "· found by both models" : ""; },
    scoring() { return this.mapped ? this.mapped.scoring : ""; },
    /* "shared" on a hit `h` that the other list `r` also holds. */
    sharedClass(h, r) { return r && this.hits(r).some(x => x.id === h.id) ? "shared" : ""; },
    hitMeta(h) { return `#${h.id} · ${this.score(h)}`; },
    path(r) {
      if (!r) return "";
      if (!r.maps || !r.maps.length) return "none (same space)";
      return r.maps.map(m => typeof m === "string" ? m : (m.ref || `${m.name}:${m.version}`)).join(" → ");
    },
  });
}

function steerPage() {
  return page({
    steers: [], indexes: [], steer: "", index: "", query: "", eps: 0, k: 10,
    base: null, steered: null, share: null, shown: null, sweep: [], sweepOf: null, steerMsg: "",
    prompt: "The movie was", genText: "", tokens: [], lmMsg: "", lmModel: "", lmEps: 0,
    async load() {
      const [s, i] = await Promise.all([VB.api("/v1/steers"), VB.api("/v1/indexes")]);
      this.steers = s.data; this.indexes = i.data;
      if (!this.current()) this.steer = this.steers.map(x => this.steerRef(x)).find(ref => ref) || "";
      this.pickIndex();
    },
    current() { return this.steers.find(s => this.steerRef(s) && this.steerRef(s) === this.steer) || null; },
    /* The ref the picker applies for the steer `s` (a /v1/steers summary): its bare name when that resolves
       (`bare_version`), else name@alias of an alias on a live version (its live versions all flagged unreliable,
       only an alias reaches one); "" when nothing can be applied (no live version, or flagged ones no alias
       holds). Such a steer was offered like any other, and the search or generation then failed (a 404). */
    steerRef(s) {
      if (s.bare_version !== null) return s.name;
      const gone = new Set(s.aliases_on_deleted || []);
      const held = Object.keys(s.aliases || {}).filter(a => !gone.has(a)).sort();
      return held.length ? `${s.name}@${held[0]}` : "";
    },
    steerUnusable(s) { return !this.steerRef(s); },
    noneUsable() { return this.steers.length > 0 && this.steers.every(s => !this.steerRef(s)); },
    isLM() { const s = this.current(); return !!s && String(s.space || "").startsWith("lm."); },
    isSearchSteer() { return !this.isLM(); },
    steerOption(s) {
      const ref = this.steerRef(s);
      if (ref === s.name) return `${s.name} (${s.space})`;
      if (ref) return `${ref} (${s.space}; by its alias: every live version is flagged unreliable)`;
      const flagged = (s.unreliable_versions || []).map(v => `${s.name}:${v}`).join(", ");
      return `${s.name} (${s.space}): not offered here, ` + (s.n_live_versions
        ? `every live version is flagged unreliable (${flagged}) and no alias holds one (point an alias at one, `
          + "or name it as NAME:N over the API)" : "no live version");
    },
    submit() { return this.isLM() ? this.generate() : this.run(); },
    submitText() {
      if (this.busy) return this.isLM() ? "Generating…" : "Searching…";
      return this.isLM() ? "Generate" : "Search";
    },
    epsText() { return Number(this.eps).toFixed(2); },
    /* Letting go of the ε slider re-runs a steered search that has a query (LM generation waits for the button). */
    epsChanged() { if (!this.isLM() && this.query) this.run(); },
    pickIndex() {
      const s = this.current();
      const same = s ? this.indexes.filter(i => i.space === s.space) : [];
      if (!same.find(i => i.name === this.index)) this.index = same.length ? same[0].name : "";
    },
    indexesForSteer() { const s = this.current(); return s ? this.indexes.filter(i => i.space === s.space) : []; },
    /* One search of `ask` (index, query, steer, k) at ε `eps` (0: unsteered), given up when `signal` aborts. */
    async search(eps, ask = this.question(), signal = undefined) {
      const body = { texts: [ask.query], k: ask.k, include_payloads: true };
      if (eps) body.steers = { [ask.steer]: Number(eps) };
      return VB.api(`/v1/indexes/${encodeURIComponent(ask.index)}/search`, { method: "POST", body, signal });
    },
    question() { return { index: this.index, query: this.query, steer: this.steer, k: kOf(this.k) }; },
    /* Share of the results carrying the attribute: payload `label` > 0 (null when payloads have no label). */
    shareOf(r) {
      const hs = r ? r.results[0] : [];
      const labelled = hs.filter(h => h.payload && typeof h.payload.label === "number");
      if (!labelled.length) return null;
      return labelled.filter(h => h.payload.label > 0).length / labelled.length;
    },
    /* Each ε change re-runs the search: only the latest run's answer is shown (an older, slower one arriving last
       showed ε = 0.25's hits under "ε = 3"), labelled with the ε and steer it searched; a failed run clears them. */
    async run() {
      const ctl = this.supersede();
      this.steerMsg = ""; this.busy = false;  // a run given up above ends here, not in its own finally
      if (!this.current()) { this.clearResults(); this.steerMsg = "pick a steer that can be applied"; return; }
      if (!this.index) { this.clearResults(); this.steerMsg = "no index lives in this steer's space"; return; }
      if (!this.query.trim()) { this.clearResults(); this.steerMsg = "type a query first"; return; }
      const ask = { ...this.question(), eps: Number(this.eps) };
      this.busy = true;
      try {
        const [base, steered] = await Promise.all([this.search(0, ask, ctl.signal),
                                                   this.search(ask.eps, ask, ctl.signal)]);
        if (!this.latest(ctl)) return;
        [this.base, this.steered, this.shown] = [base, steered, ask];
        this.share = { before: this.shareOf(base), after: this.shareOf(steered) };
      } catch (e) {
        if (this.latest(ctl)) { this.clearResults(); this.steerMsg = VB.say(e); }
      } finally { if (this.latest(ctl)) this.busy = false; }
    },
    clearResults() { this.base = this.steered = this.share = this.shown = null; },
    /* Another steer picked: the results shown were another steer's (and a search in flight is given up). */
    steerChanged() {
      this.pickIndex();
      if (this.asking) this.asking.abort();
      this.asking = null; this.busy = false; this.clearResults(); this.clearSweep();
    },
    shownEps() { return this.shown ? String(this.shown.eps) : ""; },
    /* The steered list's heading: the ε it was searched at, "steered" before any (it read "ε =" with nothing). */
    steeredHeading() { return this.shown ? `ε = ${this.shownEps()}` : "steered"; },
    /* A sweep is a request of the page like a run: a newer run or sweep gives it up (a slider moved mid-sweep
       re-enabled "Sweep ε" while the sweep went on, and its chart then landed under the newer question), and
       its chart says the steer, index and query it answers. */
    async runSweep() {
      const ctl = this.supersede();
      this.steerMsg = ""; this.busy = false;
      if (!this.current()) { this.steerMsg = "pick a steer that can be applied"; return; }
      if (!this.index || !this.query.trim()) { this.steerMsg = "pick an index and type a query first"; return; }
      const grid = [-2, -1, -0.5, 0, 0.5, 1, 2], ask = this.question();
      this.busy = true;
      try {
        const rs = await Promise.all(grid.map(e => this.search(e, ask, ctl.signal)));
        if (!this.latest(ctl)) return;
        this.clearSweep();
        const sweep = grid.map((e, i) => [e, this.shareOf(rs[i])]);
        if (sweep.some(p => p[1] === null)) {
          this.steerMsg = "the index's payloads carry no numeric `label`, so the attribute share is unknown";
          return;
        }
        [this.sweep, this.sweepOf] = [sweep, ask];
        const series = [{ label: "attribute share", values: sweep.map(p => p[1]) }];
        this.$nextTick(() => VB.chart(this.$refs.sweep, grid, series,
          { xlabel: "ε", ylabel: "attribute share", yrange: [0, 1] }));
      } catch (e) {
        if (this.latest(ctl)) { this.clearSweep(); this.steerMsg = VB.say(e); }
      } finally { if (this.latest(ctl)) this.busy = false; }
    },
    clearSweep() { this.sweep = []; this.sweepOf = null; VB.chart(this.$refs.sweep, [], []); },
    sweepText() {
      const s = this.sweepOf;
      return s ? ` (steer ${s.steer}, index ${s.index}, query "${s.query}")` : "";
    },
    changed() {
      if (!this.base || !this.steered) return null;
      const A = new Set(this.base.results[0].map(h => h.id));
      return this.steered.results[0].filter(h => !A.has(h.id)).length;
    },
    changedText() {
      const s = this.shown;
      return s ? `${this.changed()} of ${this.hits(this.steered).length} results changed at ε = ${s.eps} ` +
        `(steer ${s.steer}, index ${s.index})` : "";
    },
    shareText() {
      const s = this.share;
      return s && s.before !== null ? VB.pct(s.before) + " → " + VB.pct(s.after) : "unknown (no label in payloads)";
    },
    modelText() { return `(${this.lmModel}, ε = ${this.lmEps})`; },
    async generate() {
      this.lmMsg = ""; this.genText = ""; this.tokens = [];
      this.busy = true;
      try {
        const g = await VB.api("/v1/lm/generate", { method: "POST", timeout: VB.lmTimeoutSeconds,
          body: { prompt: this.prompt, steers: { [this.steer]: Number(this.eps) }, max_new_tokens: 24 } });
        this.genText = g.text; this.lmModel = g.model; this.lmEps = Number(this.eps);
        const a = await VB.api("/v1/lm/analyze", { method: "POST", timeout: VB.lmTimeoutSeconds,
          body: { steer: this.steer, text: VB.join(this.prompt, g.text), eps: Math.abs(Number(this.eps)) || 1.0 } });
        this.tokens = a.tokens;
      } catch (e) { this.lmMsg = VB.say(e); } finally { this.busy = false; }
    },
    /* A token's background, green (score > 0) or red, its alpha |score| clipped to 1. An object, not a string:
       Alpine sets an object through the CSSOM (style.setProperty), a string as a style attribute, which the
       console's policy refuses. */
    tokenStyle(t) {
      const s = Math.max(-1, Math.min(1, t.score));
      return { background: s >= 0 ? `rgba(46,139,87,${Math.abs(s)})` : `rgba(192,57,43,${Math.abs(s)})` };
    },
  });
}

function migrationsPage() {
  return page({
    jobs: [], indexes: [], maps: [], checkpoints: [],
    source: "", target: "", map: "", alias: "", dryRun: true, migMsg: "", mapHint: "", sourceSpace: null,
    async load() {
      this.maps = (await VB.api("/v1/maps")).data || [];
      await this.follow();
    },
    /* The map offered for the source collection: one whose source space is the space the collection records
       (GET /v1/collections/{name}), its `prod`-aliased one first; none, with a hint, when no map leaves that space
       or the collection records none. It was the first map by name, whatever the collection held. */
    async sourceChanged() {
      const name = this.source.trim();
      this.sourceSpace = null; this.map = ""; this.mapHint = "";
      if (!name) return;
      let info;
      try { info = await VB.api(`/v1/collections/${encodeURIComponent(name)}`); } catch (e) {
        if (this.source.trim() === name) this.mapHint = `pick the map from the collection's space (${VB.say(e)})`;
        return;
      }
      if (this.source.trim() !== name) return;  // typed on meanwhile: that name's answer decides
      this.sourceSpace = info.space;
      if (!info.space) {
        this.mapHint = `${name} records no space: pick the map from the space of its vectors`;
        return;
      }
      const from = this.maps.filter(m => m.source_space === info.space);
      const pick = from.find(m => "prod" in (m.aliases || {})) || from[0];
      if (pick) this.map = pick.name;
      else this.mapHint = `no map leaves space ${info.space} (${name}'s): fit one from ${info.space} first`;
    },
    /* What a migration changes (jobs, checkpoints, indexes): every second while one runs (rows written / total), as
       the jobs page does; the maps are read once a load (every map's summary each second was most of the cost). */
    async follow() {
      const mine = "/v1/jobs?kind=migration&kind=verify";  // this page's jobs only: its newest, its oldest live
      const [j, l, i, c] = await Promise.all([VB.api(`${mine}&order=newest&limit=${JOBS_SHOWN}`),
        VB.api(`${mine}&state=queued&state=running&order=oldest&limit=${LIVE_MAX}`),
        VB.api("/v1/indexes"), VB.api("/v1/migrations")]);
      this.indexes = i.data;
      this.checkpoints = c.data || [];
      this.jobs = newestFirst(j.data, l.data).filter(x => /migrat|verify/i.test(x.kind));
      if (this.polling()) this.startPolling();
    },
    polling() { return this.jobs.some(x => this.live(x)); },
    /* POST /v1/migrations (a write key); the job appears in the table below and is followed there. */
    async start() {
      this.migMsg = "";
      const body = { source: this.source.trim(), target: this.target.trim(), map: this.map, dry_run: this.dryRun };
      if (this.alias.trim()) body.alias = this.alias.trim();
      try {
        const job = await VB.api("/v1/migrations", { method: "POST", body });
        this.migMsg = `queued ${this.shortId(job)}: ${job.description}`;
        await this.load();
      } catch (e) { this.migMsg = VB.say(e); }
    },
    mapOption(m) { return `${m.name} (${m.source_space} → ${m.target_space})`; },
    fieldsText(c) { return (c.fields || []).join(", "); },
    rowsText(c) { return c.error ? c.error : `${VB.num(c.done)} / ${VB.num(c.total)}`; },
    /* A checkpoint not finished: queued or running while a live job of this page migrates its source to its
       target (the job's description says which), else stopped, or not started when no batch was written (last_id
       is null until the first one is). */
    stateText(c) {
      if (c.error) return "unreadable";
      if (c.finished) return "finished";
      const what = `migrate ${c.source} -> ${c.target} `;
      const job = this.jobs.find(j => this.live(j) && j.kind === "migration" && j.description.startsWith(what));
      const none = c.last_id === null || c.last_id === undefined;
      if (job) return `${job.state}: ${none ? "no rows written yet" : "written up to id " + c.last_id}`;
      return none ? "not started yet: no rows written" : `stopped after id ${c.last_id}`;
    },
    outcome(j) {
      if (j.error) return `${j.error.type}: ${j.error.message}`;
      if (j.kind === "verify" && j.result) return this.verifyText(j.result);
      const r = j.result && j.result.report;
      if (!r) return j.result ? JSON.stringify(j.result) : "";  // a running job has no result yet: nothing shown
      const x = r.extra || {};
      if (x.dry_run) return `dry run: would ${x.start} ${r.target}, ${x.rows_to_write} rows to write; space ${x.space_check}`;
      return `${r.rows} rows in ${r.target} (${r.rows_this_run} this run, ${r.seconds.toFixed(1)}s)` +
        (r.alias ? `; alias ${r.alias} → ${r.target}` : "");
    },
    /* A verification's figures in words (its result was shown as raw JSON): the verdict, recall, the rows check. */
    verifyText(v) {
      const parts = [];
      const recall = v.k !== undefined ? v[`recall@${v.k}`] : undefined;
      if (typeof recall === "number") parts.push(`recall@${v.k} ${recall.toFixed(3)} (${v.mode})`);
      if (v.rows_ok !== undefined) {
        parts.push(v.rows_ok ? `every row of ${v.collection} matches ${v.source}`
          : `${VB.num(v.missing_rows)} missing, ${VB.num(v.extra_rows)} extra, ${VB.num(v.wrong_vectors)} wrong, ` +
            `${VB.num(v.wrong_fields || 0)} other-field rows against ${v.source}`);
      }
      const fails = (v.fails || []).length ? ` — ${v.fails.join("; ")}` : "";
      return `${v.verdict || "checked"}: ${parts.join("; ")}${fails}`;
    },
  });
}
window.VB = VB;

document.addEventListener("alpine:init", () => {
  const components = { keyBar, registryPage, jobsPage, searchPage, steerPage, migrationsPage };
  for (const [name, make] of Object.entries(components)) window.Alpine.data(name, make);
});
