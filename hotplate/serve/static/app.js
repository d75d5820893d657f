// hotplate studio: the gallery, the lip-sync form, progress over SSE, past renders.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { catalog: [], persona: null, attire: null, job: null, events: null, tokenRequired: false };

// -- the token: asked for once (on the first 401), kept for this tab only ----------------

const TOKEN_KEY = "hotplate-token";

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY) || "";
  return token ? { Authorization: `Bearer ${token}` } : {};
}

// fetch with the token; a 401 (or 403: a wrong token) asks for it and tries again. The
// requests of one page load share the answer: a request refused with the token that was
// set when it left only retries with the newer one, without asking again.
async function api(url, options = {}) {
  const call = () => fetch(url, { ...options, headers: { ...(options.headers || {}), ...authHeaders() } });
  const used = sessionStorage.getItem(TOKEN_KEY);
  let response = await call();
  const wrong = response.status === 403 && /token is wrong/.test((await response.clone().text()));
  if (response.status === 401 || wrong) {
    if (sessionStorage.getItem(TOKEN_KEY) === used) {
      const token = window.prompt("This hotplate server needs a token:");
      if (!token || !token.trim()) return response;
      sessionStorage.setItem(TOKEN_KEY, token.trim());
    }
    response = await call();
  }
  return response;
}

// <video src>, download links and EventSource cannot send a header: they get a URL signed
// for that one path (GET /v1/sign), valid for an hour
async function signed(path) {
  if (!state.tokenRequired) return path;
  const response = await api(`/v1/sign?path=${encodeURIComponent(path)}`);
  if (!response.ok) throw new Error(await problemText(response));
  return (await response.json()).url;
}

// <img src> the same way as fetch + a blob URL (a thumbnail is small)
async function showImage(img, path) {
  const response = await api(path);
  if (response.ok) img.src = URL.createObjectURL(await response.blob());
}

async function problemText(response) {
  try {
    const body = await response.json();
    return body.detail || body.title || `HTTP ${response.status}`;
  } catch (_) {
    return `HTTP ${response.status}`;
  }
}

function showError(text) {
  $("error").textContent = text || "";
  $("error").classList.toggle("hidden", !text);
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children) node.append(child);
  return node;
}

// -- server and catalog ----------------------------------------------------------------

async function loadServer() {
  try {
    const health = await (await fetch("/healthz")).json();
    state.tokenRequired = health.token_required;
    const ready = await fetch("/readyz");
    const r = await ready.json();
    $("server-state").innerHTML = "";
    $("server-state").append(el("span", { class: `dot ${ready.ok ? "up" : ""}` }),
      `${r.workers} worker${r.workers === 1 ? "" : "s"} · ${r.queued} queued`);
  } catch (_) {
    $("server-state").textContent = "server unreachable";
  }
}

function attiresOf(persona) {
  const rows = state.catalog.filter((row) => row.persona === persona);
  const attires = {};
  for (const row of rows) (attires[row.attire] ||= []).push(row);
  return attires;
}

async function loadCatalog() {
  const response = await api("/v1/personas");
  if (!response.ok) return showError(await problemText(response));
  state.catalog = (await response.json()).personas;
  const personas = [...new Set(state.catalog.map((row) => row.persona))];
  const hot = state.catalog.filter((row) => row.state === "hot").length;
  $("catalog-summary").textContent = `${personas.length} persona${personas.length === 1 ? "" : "s"} · ${hot} of ${state.catalog.length} hot`;
  const gallery = $("gallery");
  gallery.innerHTML = "";
  if (!state.catalog.length) {
    gallery.append(el("p", { class: "muted" }, "No personas yet: drop loops and stills into the personas folder."));
  }
  for (const persona of personas) {
    for (const [attire, rows] of Object.entries(attiresOf(persona))) {
      const hotRows = rows.filter((row) => row.state === "hot");
      const isHot = hotRows.length > 0;
      const thumb = el("div", { class: "thumb" });
      if (isHot) {
        const img = el("img", { alt: `${persona} ${attire}` });
        showImage(img, hotRows[0].thumbnail);
        thumb.append(img);
      }
      else thumb.append(el("span", { class: "initials" }, persona.slice(0, 2).toUpperCase()));
      const badge = isHot ? (hotRows.length < rows.length ? `hot ${hotRows.length}/${rows.length}` : "hot") : "cold";
      thumb.append(el("span", { class: `badge ${isHot ? "hot" : "cold"}`, title: isHot ? "" : rows[0].why || "" }, badge));
      const motions = rows.map((row) => row.motion).join(", ");
      const card = el("button", { class: "card", type: "button", "data-persona": persona, "data-attire": attire, "data-testid": `card-${persona}-${attire}` },
        thumb,
        el("div", { class: "card-body" },
          el("div", { class: "card-title" }, persona),
          el("div", { class: "card-sub" }, `${attire} · ${rows[0].kind === "still" ? "still" : motions}`)));
      card.addEventListener("click", () => select(persona, attire));
      if (persona === state.persona && attire === state.attire) card.classList.add("selected");
      gallery.append(card);
    }
  }
  if (state.persona) fillMotions();  // the states in the motion picker may have changed
}

function select(persona, attire) {
  state.persona = persona;
  state.attire = attire;
  for (const card of document.querySelectorAll(".card")) {
    card.classList.toggle("selected", card.dataset.persona === persona && card.dataset.attire === attire);
  }
  $("selected-name").textContent = persona;
  const attires = attiresOf(persona);
  const attireSelect = $("attire");
  attireSelect.innerHTML = "";
  for (const name of Object.keys(attires)) attireSelect.append(el("option", { value: name, selected: name === attire }, name));
  attireSelect.disabled = false;
  fillMotions();
  updateButtons();
}

function fillMotions() {
  const rows = attiresOf(state.persona)[state.attire] || [];
  const motion = $("motion");
  const chosen = motion.value;
  motion.innerHTML = "";
  for (const row of rows) {
    const value = row.kind === "still" ? "" : row.motion;
    motion.append(el("option", { value, selected: value === chosen }, `${row.motion} · ${row.state}`));
  }
  motion.disabled = rows.length <= 1;
}

function updateButtons() {
  const busy = state.job !== null;
  $("render").disabled = busy || !state.persona || !$("audio").files.length;
  $("precompile").disabled = busy || !state.persona;
  $("cancel").classList.toggle("hidden", !busy);
}

// -- a render ---------------------------------------------------------------------------

function setProgress(job) {
  const pct = Math.round(100 * (job.progress || 0));
  $("progress-fill").style.width = `${pct}%`;
  $("progress-pct").textContent = `${pct}%`;
  const step = job.step || job.state;
  $("progress-step").textContent = job.state === "queued" ? "waiting for a worker…"
    : step.startsWith("jit") ? `cold: precompiling (${step.slice(4)})` : step === "render" ? "rendering frames" : step;
}

async function follow(job, onDone) {
  state.job = job;
  updateButtons();
  setProgress(job);
  const events = new EventSource(await signed(`/v1/renders/${job.id}/events`));
  state.events = events;
  events.addEventListener("progress", (e) => setProgress(JSON.parse(e.data)));
  const finish = (e) => {
    const result = JSON.parse(e.data);
    events.close();
    state.job = null;
    state.events = null;
    setProgress(result);
    updateButtons();
    if (result.state === "done") onDone(result);
    else showError(`${result.state}: ${result.error || ""}`);
    $("progress-step").textContent = result.state === "done" ? "done" : result.state;
    loadRenders();
    loadCatalog();
  };
  events.addEventListener("done", finish);
  events.addEventListener("failed", finish);
}

async function play(job) {
  const player = $("player");
  player.src = await signed(job.video_url);
  player.load();
  const t = (x) => (x == null ? "–" : `${Number(x).toFixed(2)} s`);
  $("timings").textContent = `${job.jit ? `cold → precompiled just in time in ${t(job.jit_seconds)}` : "cache hit"} · first frame ${t(job.first_frame_seconds)} · total ${t(job.total_seconds)}`;
}

async function submitRender(event) {
  event.preventDefault();
  showError("");
  const form = new FormData();
  form.append("persona", state.persona);
  form.append("attire", $("attire").value);
  if ($("motion").value) form.append("motion", $("motion").value);
  if ($("backend").value) form.append("backend", $("backend").value);
  form.append("audio", $("audio").files[0]);
  const response = await api("/v1/renders", { method: "POST", body: form });
  if (!response.ok) return showError(await problemText(response));
  follow(await response.json(), play);
}

async function precompile() {
  showError("");
  const form = new FormData();
  form.append("persona", state.persona);
  form.append("attire", $("attire").value);
  if ($("motion").value) form.append("motion", $("motion").value);
  const response = await api("/v1/precompile", { method: "POST", body: form });
  if (!response.ok) return showError(await problemText(response));
  follow(await response.json(), () => { $("timings").textContent = "now hot"; });
}

async function cancel() {
  if (!state.job) return;
  await api(`/v1/renders/${state.job.id}`, { method: "DELETE" });
}

// -- past renders -------------------------------------------------------------------------

async function loadRenders() {
  const response = await api("/v1/renders?limit=30");
  if (!response.ok) return;
  const body = $("renders");
  body.innerHTML = "";
  for (const job of (await response.json()).renders) {
    const when = new Date(job.created * 1000);
    const actions = el("td");
    if (job.video_url) {
      const open = el("a", { href: "#" }, "Play");
      open.addEventListener("click", (e) => { e.preventDefault(); play(job); });
      const save = el("a", { href: job.video_url, download: "" }, "Download");
      save.addEventListener("click", async (e) => {
        if (save.dataset.signed) return;  // the second, signed click downloads
        e.preventDefault();
        save.href = await signed(job.video_url);
        save.dataset.signed = "1";
        save.click();
      });
      actions.append(open, save);
    } else if (job.error) {
      actions.append(el("span", { class: "err", title: job.error }, job.error.slice(0, 60)));
    }
    body.append(el("tr", {},
      el("td", {}, when.toLocaleTimeString()),
      el("td", {}, job.persona),
      el("td", {}, `${job.attire}${job.motion ? ` / ${job.motion}` : ""}${job.kind === "precompile" ? " (precompile)" : ""}`),
      el("td", {}, el("span", { class: `pill ${job.state}` }, job.state)),
      el("td", {}, job.jit == null ? "–" : job.kind === "precompile" ? (job.jit ? "made hot" : "was hot") : job.jit ? "JIT" : "hit"),
      el("td", {}, job.audio_seconds ? `${job.audio_seconds.toFixed(1)} s` : "–"),
      el("td", {}, job.total_seconds ? `${job.total_seconds.toFixed(1)} s` : "–"),
      actions));
  }
}

// -- wiring -------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("attire").addEventListener("change", () => { state.attire = $("attire").value; select(state.persona, state.attire); });
  $("audio").addEventListener("change", () => {
    const file = $("audio").files[0];
    $("audio-name").textContent = file ? `${file.name} · ${(file.size / 1024).toFixed(0)} KB` : "Drop a voice clip here";
    updateButtons();
  });
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    $("audio").files = e.dataTransfer.files;
    $("audio").dispatchEvent(new Event("change"));
  });
  $("compose").addEventListener("submit", submitRender);
  $("precompile").addEventListener("click", precompile);
  $("cancel").addEventListener("click", cancel);
  $("refresh").addEventListener("click", () => { loadCatalog(); loadRenders(); loadServer(); });
  loadServer().then(() => { loadCatalog(); loadRenders(); });
  setInterval(loadServer, 10000);
});
