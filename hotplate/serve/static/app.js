// hotplate studio: the gallery, the lip-sync form, progress over SSE, renders played
// while they are made (MSE), live mode (the microphone over /v1/live), talk mode (a
// conversation session over WebRTC, /v1/sessions), past renders.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { catalog: [], persona: null, attire: null, job: null, events: null, tokenRequired: false, retry: null };

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

// <video src>, download links, EventSource and WebSocket cannot send a header: they get a
// URL signed for that one method and path (GET /v1/sign), valid for an hour
async function signed(path, method = "GET") {
  if (!state.tokenRequired) return path;
  const response = await api(`/v1/sign?path=${encodeURIComponent(path)}&method=${method}`);
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

// -- busy: a 503 with Retry-After (or a live session closed 1013) is shown as a countdown,
// then the request is sent again by itself; Cancel stops the wait

function showBusy(left) {
  $("busy").textContent = left > 0 ? `busy, retry in ${left} s` : "";
  $("busy").classList.toggle("hidden", !(left > 0));
}

// resolves true once `seconds` and up to a second of jitter have passed (pages refused
// together come back apart), false when Cancel was pressed first
function countdown(seconds) {
  return new Promise((resolve) => {
    let left = Math.max(1, Math.round(seconds));
    let done = false;
    const end = (again) => {
      if (done) return;
      done = true; clearInterval(timer); state.retry = null; showBusy(0); updateButtons(); resolve(again);
    };
    const timer = setInterval(() => {
      left -= 1;
      if (left <= 0) { clearInterval(timer); setTimeout(() => end(true), Math.random() * 1000); } else showBusy(left);
    }, 1000);
    state.retry = { cancel: () => end(false) };
    showBusy(left);
    updateButtons();
  });
}

// POST work (a render, a stream, a precompile); a busy server's 503 is waited out and sent again
async function postWork(url, form) {
  for (;;) {
    const response = await api(url, { method: "POST", body: form });
    const after = parseInt(response.headers.get("Retry-After") || "", 10);
    if (response.status !== 503 || !(after > 0)) return response;
    if (!(await countdown(after))) return null;
  }
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
  const busy = state.job !== null || state.retry !== null;
  $("render").disabled = busy || !state.persona || !$("audio").files.length;
  $("precompile").disabled = busy || !state.persona;
  $("live").disabled = (busy && !live.mic) || !state.persona || talk.pc !== null;
  $("talk").disabled = (busy && talk.pc === null) || !state.persona || live.mic !== null;
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
  player.srcObject = null;
  player.src = await signed(job.video_url);
  player.load();
  showTimings(job);
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
  if ($("stream").checked && window.MediaSource) return streamRender(form);
  const response = await postWork("/v1/renders", form);
  if (!response) return;
  if (!response.ok) return showError(await problemText(response));
  follow(await response.json(), play);
}

async function precompile() {
  showError("");
  const form = new FormData();
  form.append("persona", state.persona);
  form.append("attire", $("attire").value);
  if ($("motion").value) form.append("motion", $("motion").value);
  const response = await postWork("/v1/precompile", form);
  if (!response) return;
  if (!response.ok) return showError(await problemText(response));
  follow(await response.json(), () => { $("timings").textContent = "now hot"; });
}

async function cancel() {
  if (state.retry) return state.retry.cancel();
  if (!state.job) return;
  await api(`/v1/renders/${state.job.id}`, { method: "DELETE" });
}

// -- streams: fragmented MP4 into Media Source Extensions ------------------------------
//
// Both POST /v1/lip-sync/stream and WS /v1/live send an init segment (ftyp+moov) and
// then fragments (moof+mdat). MsePlayer takes the bytes in any chunks, cuts them into
// top-level boxes, creates the SourceBuffer from the init segment's codecs and appends
// each segment in order; the <video> plays from the first fragment on.

// What the tests (and a curious editor) can read: window.hotplateStream
window.hotplateStream = { kind: null, bytes: 0, fragments: 0, ended: false, playingBeforeEnd: null, final: null };

function codecsOf(init) {
  const text = (i, n) => String.fromCharCode(...init.subarray(i, i + n));
  const hex = (b) => b.toString(16).padStart(2, "0");
  let video = "avc1.42E01E";
  for (let i = 4; i + 8 < init.length; i++) {
    if (text(i, 4) === "avcC") { video = `avc1.${hex(init[i + 5])}${hex(init[i + 6])}${hex(init[i + 7])}`; break; }
  }
  const audio = [...Array(init.length - 4).keys()].some((i) => text(i, 4) === "mp4a") ? ',mp4a.40.2' : "";
  return `video/mp4; codecs="${video}${audio}"`;
}

class MsePlayer {
  constructor(video, kind) {
    this.video = video;
    this.kind = kind;
    this.pending = new Uint8Array(0);
    this.segments = [];
    this.init = null;
    this.buffer = null;
    this.ended = false;
    this.source = new MediaSource();
    video.srcObject = null;  // a talk session's stream, if one played here
    this.opened = new Promise((resolve) => this.source.addEventListener("sourceopen", resolve, { once: true }));
    video.src = URL.createObjectURL(this.source);
    window.hotplateStream = { kind, bytes: 0, fragments: 0, ended: false, playingBeforeEnd: null, final: null, saved: [] };
    const stream = window.hotplateStream;
    video.addEventListener("timeupdate", () => {
      if (stream.playingBeforeEnd === null && video.currentTime > 0) stream.playingBeforeEnd = !stream.ended;
    });
  }

  push(bytes) {
    const stream = window.hotplateStream;
    stream.bytes += bytes.length;
    if (stream.saved) stream.saved.push(bytes);
    const all = new Uint8Array(this.pending.length + bytes.length);
    all.set(this.pending);
    all.set(bytes, this.pending.length);
    let at = 0;
    const view = new DataView(all.buffer);
    while (all.length - at >= 8) {
      const size = view.getUint32(at);
      if (size < 8 || all.length - at < size) break;
      const type = String.fromCharCode(...all.subarray(at + 4, at + 8));
      const box = all.subarray(at, at + size);
      at += size;
      if (type === "ftyp") { this.head = [box]; continue; }
      if (type === "moov") { this.head.push(box); this.setInit(concat(this.head)); continue; }
      if (type === "moof") { this.head = [box]; continue; }
      if (type === "mdat") { this.head.push(box); this.segments.push(concat(this.head)); stream.fragments += 1; }
    }
    this.pending = all.slice(at);
    this.pump();
  }

  async setInit(init) {
    await this.opened;
    this.buffer = this.source.addSourceBuffer(codecsOf(init));
    this.buffer.mode = "segments";
    this.buffer.addEventListener("updateend", () => this.pump());
    this.segments.unshift(init);
    this.pump();
  }

  pump() {
    if (!this.buffer || this.buffer.updating) return;
    if (this.segments.length) {
      this.buffer.appendBuffer(this.segments.shift());
      if (this.video.paused && this.buffer.buffered.length === 0) this.video.play().catch(() => {});
      return;
    }
    if (this.ended && this.source.readyState === "open") this.source.endOfStream();
    if (this.video.paused && this.buffer.buffered.length) this.video.play().catch(() => {});
    // live: stay near the live edge if playback fell behind
    if (this.kind === "live" && this.buffer.buffered.length) {
      const edge = this.buffer.buffered.end(this.buffer.buffered.length - 1);
      if (edge - this.video.currentTime > 1.5) this.video.currentTime = edge - 0.3;
    }
  }

  end() {
    this.ended = true;
    window.hotplateStream.ended = true;
    this.pump();
  }
}

function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

async function streamRender(form) {
  const player = new MsePlayer($("player"), "render");
  const started = performance.now();
  const response = await postWork("/v1/lip-sync/stream", form);
  if (!response) return;
  if (!response.ok) return showError(await problemText(response));
  const id = response.headers.get("X-Hotplate-Job");
  // JIT progress on a miss (and render progress) comes on the job's SSE channel
  follow({ id, state: "queued", step: "" }, (job) => showTimings(job));
  const reader = response.body.getReader();
  let first = null;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      player.push(value);
      if (first === null && window.hotplateStream.fragments > 0) {
        first = (performance.now() - started) / 1000;
        $("stream-state").textContent = `streaming · first fragment after ${first.toFixed(2)} s`;
      }
    }
    player.end();
    $("stream-state").textContent = `streamed ${window.hotplateStream.fragments} fragments · first after ${(first || 0).toFixed(2)} s`;
  } catch (err) {
    showError(`the stream broke off: ${err.message}; the render's record says why`);
  }
}

function showTimings(job) {
  const t = (x) => (x == null ? "–" : `${Number(x).toFixed(2)} s`);
  $("timings").textContent = `${job.jit ? `cold → precompiled just in time in ${t(job.jit_seconds)}` : "cache hit"} · first frame ${t(job.first_frame_seconds)} · total ${t(job.total_seconds)}`;
}

// -- live: the microphone over /v1/live ---------------------------------------------------

const live = { ws: null, ctx: null, mic: null, node: null, retryAfter: null };

async function startLive() {
  showError("");
  let mic;
  try {
    mic = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
  } catch (err) {
    return showError(`no microphone: ${err.message}`);
  }
  const ctx = new AudioContext();
  await ctx.audioWorklet.addModule("/static/pcm-worklet.js");
  const node = new AudioWorkletNode(ctx, "pcm-tap");
  ctx.createMediaStreamSource(mic).connect(node);
  const path = await signed("/v1/live", "WEBSOCKET"); // a WebSocket cannot send a header either
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`);
  ws.binaryType = "arraybuffer";
  const player = new MsePlayer($("player"), "live");
  Object.assign(live, { ws, ctx, mic, node, player });
  ws.onopen = () => {
    ws.send(JSON.stringify({
      persona: state.persona, attire: $("attire").value, motion: $("motion").value || null,
      backend: $("backend").value || null, sample_rate: ctx.sampleRate, channels: 1, format: "s16le",
    }));
    node.port.onmessage = (e) => {
      if (ws.readyState !== WebSocket.OPEN) return;
      const f = e.data;
      const pcm = new Int16Array(f.length);
      for (let i = 0; i < f.length; i++) pcm[i] = Math.max(-1, Math.min(1, f[i])) * 32767;
      ws.send(pcm.buffer);
    };
    $("live").textContent = "■ Stop";
    $("live").classList.add("live-on");
    $("stream-state").textContent = "live: speak…";
  };
  ws.onmessage = (e) => {
    if (typeof e.data !== "string") {
      player.push(new Uint8Array(e.data));
      $("stream-state").textContent = `live: ${window.hotplateStream.fragments} fragments`;
      return;
    }
    const msg = JSON.parse(e.data);
    window.hotplateStream.final = msg;
    if (msg.type === "error" && msg.retry_after) live.retryAfter = msg.retry_after;
    else if (msg.type === "error") showError(`live: ${msg.detail}`);
    else $("stream-state").textContent = `live done: ${msg.frames} frames · first fragment ${Number(msg.first_fragment_seconds || 0).toFixed(2)} s after the first audio · end lag ${Number(msg.end_lag_seconds || 0).toFixed(2)} s`;
  };
  ws.onclose = async (e) => {
    player.end();
    stopMic();
    loadRenders();
    if (e.code === 1013) { // busy at the handshake: wait as it says, then go live again
      const after = live.retryAfter || 5;
      live.retryAfter = null;
      if (await countdown(after)) startLive();
    }
  };
}

function stopMic() {
  if (live.node) live.node.port.onmessage = null;
  if (live.mic) for (const track of live.mic.getTracks()) track.stop();
  if (live.ctx) live.ctx.close();
  Object.assign(live, { ctx: null, mic: null, node: null });
  $("live").textContent = "● Live";
  $("live").classList.remove("live-on");
}

function toggleLive() {
  if (live.ws && live.ws.readyState === WebSocket.OPEN && live.mic) {
    live.ws.send(JSON.stringify({ type: "end" }));
    stopMic();
  } else {
    startLive();
  }
}

// -- talk: a conversation session over WebRTC -----------------------------------------------
//
// POST /v1/sessions, then one peer connection: the persona's video and voice come in,
// the microphone goes out (the mouth follows it), and a data channel carries
// "interrupt". "Say the clip" sends the chosen audio file's PCM over the session's
// speech WebSocket (the microphone is muted while it plays). What the tests read:
// window.hotplateTalk.

const talk = { session: null, pc: null, mic: null, channel: null, ws: null, micOn: true, aligned: null, shown: [] };
window.hotplateTalk = { state: "idle", id: null, connected: false, firstFrameSeconds: null, error: null, pictureWaitMs: null, timing: null };

function talkState(text) {
  $("talk-state").textContent = text;
}

async function startTalk() {
  showError("");
  const t = window.hotplateTalk;
  Object.assign(t, { state: "starting", id: null, connected: false, firstFrameSeconds: null, error: null, pictureWaitMs: null, timing: null });
  talkState("talk: starting a session…");
  const body = JSON.stringify({ persona: state.persona, attire: $("attire").value, motion: $("motion").value || null });
  let response;
  for (;;) {
    response = await api("/v1/sessions", { method: "POST", headers: { "Content-Type": "application/json" }, body });
    const after = parseInt(response.headers.get("Retry-After") || "", 10);
    if (response.status !== 503 || !(after > 0)) break;
    if (!(await countdown(after))) return stopTalk();
  }
  if (!response.ok) { t.error = await problemText(response); showError(`talk: ${t.error}`); return stopTalk(); }
  const session = await response.json();
  talk.session = session;
  t.id = session.id;
  const pc = new RTCPeerConnection();  // no STUN or TURN: the server offers its own addresses
  talk.pc = pc;
  updateButtons();
  pc.addTransceiver("video", { direction: "recvonly" });
  try {
    talk.mic = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
    for (const track of talk.mic.getAudioTracks()) pc.addTrack(track, talk.mic);
  } catch (err) {
    pc.addTransceiver("audio", { direction: "recvonly" });  // listen only: no microphone
    talkState(`talk: no microphone (${err.message}); the clip can still be said`);
  }
  talk.channel = pc.createDataChannel("control");
  const player = $("player");
  const started = performance.now();
  pc.addEventListener("track", (e) => {  // the video and the voice, each in a stream of its own
    const tracks = player.srcObject instanceof MediaStream ? player.srcObject.getTracks() : [];
    player.removeAttribute("src");
    player.srcObject = new MediaStream([...tracks, e.track]);
    player.play().catch(() => {});
  });
  player.addEventListener("loadeddata", () => {
    if (t.firstFrameSeconds === null && talk.pc === pc) {
      t.firstFrameSeconds = (performance.now() - started) / 1000;
      talkState(`talk: connected · first frame ${t.firstFrameSeconds.toFixed(2)} s after the offer`);
    }
  }, { once: true });
  pc.addEventListener("connectionstatechange", () => {
    t.connected = pc.connectionState === "connected";
    if (t.connected) alignPictures(pc);
    if (["failed", "closed"].includes(pc.connectionState) && talk.pc === pc) {
      talkState(`talk: the connection ${pc.connectionState}`);
      stopTalk();
    }
  });
  await pc.setLocalDescription(await pc.createOffer());
  // one offer with every candidate (WHEP without trickle)
  await new Promise((resolve) => {
    if (pc.iceGatheringState === "complete") return resolve();
    pc.addEventListener("icegatheringstatechange", () => { if (pc.iceGatheringState === "complete") resolve(); });
    setTimeout(resolve, 3000);
  });
  const answer = await api(session.whep, { method: "POST", headers: { "Content-Type": "application/sdp" }, body: pc.localDescription.sdp });
  if (!answer.ok) { t.error = await problemText(answer); showError(`talk: ${t.error}`); return stopTalk(); }
  await pc.setRemoteDescription({ type: "answer", sdp: picturesApart(await answer.text()) });
  t.state = "talking";
  $("talk").textContent = "■ End talk";
  $("talk").classList.add("live-on");
  $("talk-bar").classList.remove("hidden");
  setMic(true);
}

// The answer with its video in a media stream of its own. Chromium syncs the tracks of
// one stream (a sync group) by its own lip sync, which acted on leads of 15-18 ms by
// its playout statistics, under its 30 ms threshold: it took the lead back within a
// minute in 4 of 6 sessions, and then held the pictures behind a wait of its own that
// no jitterBufferTarget undoes (every mouth and interrupt 15 ms later). Apart, each
// track plays as soon as its own buffer lets it and the page alone sets how long
// pictures wait (alignPictures; docs/notebook/sessions.md, "The page, not chromium, holds the
// pictures to their sound"). The server's answer keeps one stream, for WHEP players
// that sync by it.
function picturesApart(sdp) {
  return sdp.split(/(?=^m=)/m)
    .map((m) => (m.startsWith("m=video") ? m.replace(/^a=msid:\S+ /m, "a=msid:hotplate-pictures ") : m))
    .join("");
}

// How long each track takes from arriving to being heard or seen, over the last
// second: the sound's jitter-buffer wait plus its output delay (webrtc-stats
// jitterBufferDelay, media-playout totalPlayoutDelay) and the pictures' time from
// arrival to display (requestVideoFrameCallback's receiveTime to expectedDisplayTime,
// median). Their difference is how far the pictures lead their sound (lead, ms), less
// how much later the server sends a sound than its picture (AUDIO_LEAD less the
// render, 8-12 ms at 540x960; bench_webrtc adds it). In window.hotplateTalk.timing, which
// bench_webrtc and the Talk test read; null until both tracks have played a second.
async function readTiming(pc, last) {
  const now = { sound: {}, shown: talk.shown.splice(0) };
  (await pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") Object.assign(now.sound, { waited: s.jitterBufferDelay, emitted: s.jitterBufferEmittedCount });
    if (s.type === "media-playout") Object.assign(now.sound, { delay: s.totalPlayoutDelay, samples: s.totalSamplesCount });
  });
  if (!last || !(now.sound.emitted > last.sound.emitted) || !(now.sound.samples > last.sound.samples) || now.shown.length < 5) return { now, timing: null };
  const waited = (now.sound.waited - last.sound.waited) / (now.sound.emitted - last.sound.emitted);
  const output = (now.sound.delay - last.sound.delay) / (now.sound.samples - last.sound.samples);
  const sound = 1000 * (waited + output);
  const picture = [...now.shown].sort((a, b) => a - b)[now.shown.length >> 1];
  return { now, timing: { sound, picture, lead: sound - picture } };
}

// Once a second: where the sound's last three readings agree within 5 ms, ask the
// pictures to wait so that they are shown PICTURE_LEAD_MS before their sound, as read
// here (jitterBufferTarget: a floor under chromium's own wait, which a picture passes by
// PICTURE_OVER_ASK_MS or so: asked 40, 43, 48 and 60 ms, shown 48, 48, 47 and 71 ms
// after it arrived, medians over a second). Set from the sound alone, which holds
// still, not from the pictures' own reading, which swings by 10-20 ms from second to
// second: a loop on it swung the pictures' wait between 35 and 78 ms. The server sends a sound
// AUDIO_LEAD (20 ms) after its frame was due and the picture once rendered (8-12 ms at
// 540x960), so 8 ms as read here is about 20 ms in all. A lead, not none: a picture
// held to its sound holds every mouth and every interrupt as long; a sound that comes
// after its picture is the side viewers forgive.
const PICTURE_LEAD_MS = 8;
const PICTURE_OVER_ASK_MS = 4;
async function alignPictures(pc) {
  const video = pc.getReceivers().find((r) => r.track.kind === "video");
  if (!video || talk.aligned === pc) return;
  talk.aligned = pc;
  talk.shown = [];
  const player = $("player");
  const onPicture = (_, meta) => {
    if (talk.pc !== pc) return;
    if (meta.receiveTime) talk.shown.push(meta.expectedDisplayTime - meta.receiveTime);
    player.requestVideoFrameCallback(onPicture);
  };
  if ("requestVideoFrameCallback" in player) player.requestVideoFrameCallback(onPicture);
  let last = null, sounds = [];
  while (talk.pc === pc) {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const { now, timing } = await readTiming(pc, last);
    last = now;
    if (!timing) continue;
    window.hotplateTalk.timing = timing;
    sounds = [...sounds, timing.sound].slice(-3);
    if (sounds.length < 3 || Math.max(...sounds) - Math.min(...sounds) > 5 || !("jitterBufferTarget" in video)) continue;
    const sound = [...sounds].sort((a, b) => a - b)[1];
    const wait = Math.max(0, Math.min(Math.round(sound - PICTURE_LEAD_MS - PICTURE_OVER_ASK_MS), 500));
    if (video.jitterBufferTarget !== null && Math.abs(wait - video.jitterBufferTarget) <= 5) continue;
    video.jitterBufferTarget = wait;
    window.hotplateTalk.pictureWaitMs = wait;
  }
}

function setMic(on) {
  talk.micOn = on;
  if (talk.mic) for (const track of talk.mic.getAudioTracks()) track.enabled = on;
  $("mic").textContent = on ? "Mic on" : "Mic off";
}

// the chosen clip, decoded by the browser, as PCM over the speech WebSocket: one turn
async function sayClip() {
  const file = $("audio").files[0];
  if (!file || !talk.session) return showError("talk: choose a clip to say first");
  setMic(false);  // its speech and the microphone's would mix in one queue
  const ctx = new AudioContext();
  const audio = await ctx.decodeAudioData(await file.arrayBuffer());
  ctx.close();
  const samples = audio.getChannelData(0);
  const pcm = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) pcm[i] = Math.max(-1, Math.min(1, samples[i])) * 32767;
  if (!talk.ws || talk.ws.readyState !== WebSocket.OPEN) {
    const path = talk.session.speech;  // signed by the server when it has tokens
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`);
    await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = () => reject(new Error("the speech socket failed")); });
    ws.send(JSON.stringify({ sample_rate: audio.sampleRate, channels: 1, format: "s16le" }));
    ws.onmessage = (e) => { const msg = JSON.parse(e.data); if (msg.type === "error") showError(`talk: ${msg.detail}`); };
    talk.ws = ws;
    talk.rate = audio.sampleRate;
  }
  if (talk.rate !== audio.sampleRate) return showError("talk: clips of one session share a sample rate");
  for (let at = 0; at < pcm.length; at += 4800) talk.ws.send(pcm.subarray(at, at + 4800));
  talk.ws.send(JSON.stringify({ type: "end_of_turn" }));
  talkState(`talk: saying ${file.name} (${audio.duration.toFixed(1)} s)`);
}

async function interruptTalk() {
  if (talk.channel && talk.channel.readyState === "open") talk.channel.send("interrupt");
  else if (talk.session) await api(talk.session.interrupt, { method: "POST" });
  talkState("talk: interrupted");
}

async function stopTalk() {
  const { session, pc, mic, ws } = talk;
  Object.assign(talk, { session: null, pc: null, mic: null, channel: null, ws: null });
  if (ws) ws.close();
  if (mic) for (const track of mic.getTracks()) track.stop();
  if (pc) pc.close();
  if (session) await api(`/v1/sessions/${session.id}`, { method: "DELETE" });
  window.hotplateTalk.state = "idle";
  window.hotplateTalk.connected = false;
  $("talk").textContent = "◉ Talk";
  $("talk").classList.remove("live-on");
  $("talk-bar").classList.add("hidden");
  $("player").srcObject = null;
  updateButtons();
}

function toggleTalk() {
  if (talk.pc) stopTalk();
  else startTalk().catch((err) => { showError(`talk: ${err.message}`); stopTalk(); });
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
    const streamed = (job.kind === "stream" || job.kind === "live") && job.state === "done" && !job.error;
    if (streamed) job.video_url = `/v1/renders/${job.id}/video`;
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
      el("td", {}, `${job.attire}${job.motion ? ` / ${job.motion}` : ""}${job.kind === "render" ? "" : ` (${job.kind})`}`),
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
  $("live").addEventListener("click", toggleLive);
  $("talk").addEventListener("click", toggleTalk);
  $("mic").addEventListener("click", () => setMic(!talk.micOn));
  $("say").addEventListener("click", () => sayClip().catch((err) => showError(`talk: ${err.message}`)));
  $("interrupt").addEventListener("click", interruptTalk);
  $("refresh").addEventListener("click", () => { loadCatalog(); loadRenders(); loadServer(); });
  loadServer().then(() => { loadCatalog(); loadRenders(); });
  setInterval(loadServer, 10000);
});
