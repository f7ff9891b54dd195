// The Live panel: the microphone streamed to /v1/realtime (OpenAI's Realtime API) as 24 kHz
// pcm16 in 100 ms appends; the server finds the turns. "Transcribe" shows each turn's words as
// they are heard; "Talk" sends each turn to the chat model and plays its spoken answer, which
// stops when the person speaks again.
import { apiKey } from "./api.js";
import { el } from "./util.js";

const RATE = 24000;
const CHUNK = RATE / 10;
const KEY_PROTOCOL = "openai-insecure-api-key.";

/** Float samples in [-1, 1] as base64 of 16-bit little-endian pcm. */
export function pcm16Base64(samples) {
  const bytes = new Uint8Array(samples.length * 2);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < samples.length; i += 1) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(i * 2, s < 0 ? s * 0x8000 : s * 0x7fff, true);
  }
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

/** base64 16-bit little-endian pcm as float samples. */
export function pcm16Samples(data) {
  const binary = atob(data);
  const view = new DataView(new ArrayBuffer(binary.length));
  for (let i = 0; i < binary.length; i += 1) view.setUint8(i, binary.charCodeAt(i));
  const samples = new Float32Array(binary.length >> 1);
  for (let i = 0; i < samples.length; i += 1) samples[i] = view.getInt16(i * 2, true) / 0x8000;
  return samples;
}

/** The session's URL on this page's server. */
export function realtimeUrl(location, mode) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}/v1/realtime${mode === "transcribe" ? "?intent=transcription" : ""}`;
}

/** The session.update each mode starts with. */
export function sessionUpdate(mode, transcriptionModel) {
  const input = {
    format: { type: "audio/pcm", rate: RATE },
    transcription: { model: transcriptionModel },
    turn_detection: { type: "server_vad" },
  };
  if (mode === "transcribe") return { type: "session.update", session: { type: "transcription", audio: { input } } };
  return { type: "session.update", session: { type: "realtime", output_modalities: ["audio"], audio: { input } } };
}

class LiveSession {
  constructor(mode, output) {
    this.mode = mode;
    this.output = output;
    this.turns = new Map();
    this.replies = new Map();
    this.playing = [];
    this.playAt = 0;
  }

  async start(transcriptionModel) {
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
    this.context = new AudioContext({ sampleRate: RATE });
    const protocols = ["realtime"];
    if (apiKey.get()) protocols.push(KEY_PROTOCOL + apiKey.get());
    this.ws = new WebSocket(realtimeUrl(window.location, this.mode), protocols);
    this.ws.addEventListener("message", (message) => this.received(JSON.parse(message.data)));
    this.ws.addEventListener("close", (event) => this.closed(event));
    await new Promise((resolve, reject) => {
      this.ws.addEventListener("open", resolve, { once: true });
      this.ws.addEventListener("error", () => reject(new Error("The live session could not connect")), { once: true });
    });
    this.ws.send(JSON.stringify(sessionUpdate(this.mode, transcriptionModel)));
    const source = this.context.createMediaStreamSource(this.stream);
    // A ScriptProcessor needs no module file; its output stays silent.
    const processor = this.context.createScriptProcessor(2048, 1, 1);
    let pending = new Float32Array(0);
    processor.addEventListener("audioprocess", (event) => {
      const input = event.inputBuffer.getChannelData(0);
      const joined = new Float32Array(pending.length + input.length);
      joined.set(pending);
      joined.set(input, pending.length);
      let at = 0;
      for (; at + CHUNK <= joined.length; at += CHUNK) {
        if (this.ws.readyState !== WebSocket.OPEN) break;
        this.ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: pcm16Base64(joined.subarray(at, at + CHUNK)) }));
      }
      pending = joined.slice(at);
    });
    source.connect(processor);
    processor.connect(this.context.destination);
  }

  stop() {
    this.ws?.close();
    this.stream?.getTracks().forEach((track) => track.stop());
    this.silence();
    this.context?.close();
  }

  line(map, id, cls) {
    if (!map.has(id)) {
      const node = el("p", { class: cls, "data-item": id });
      map.set(id, node);
      this.output.append(node);
    }
    return map.get(id);
  }

  received(event) {
    switch (event.type) {
      case "input_audio_buffer.speech_started":
        this.silence();
        this.line(this.turns, event.item_id, "live-turn partial");
        break;
      case "conversation.item.input_audio_transcription.delta":
        this.line(this.turns, event.item_id, "live-turn partial").textContent += event.delta;
        break;
      case "conversation.item.input_audio_transcription.completed": {
        const node = this.line(this.turns, event.item_id, "live-turn");
        node.textContent = event.transcript;
        node.className = "live-turn final";
        break;
      }
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        this.line(this.replies, event.response_id, "live-reply").textContent += event.delta;
        break;
      case "response.output_audio.delta":
        this.play(pcm16Samples(event.delta));
        break;
      case "error":
        this.output.append(el("p", { class: "error" }, event.error.message));
        break;
      default:
    }
  }

  play(samples) {
    const buffer = this.context.createBuffer(1, samples.length, RATE);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    this.playAt = Math.max(this.playAt, this.context.currentTime);
    source.start(this.playAt);
    this.playAt += buffer.duration;
    this.playing.push(source);
    source.addEventListener("ended", () => this.playing.splice(this.playing.indexOf(source), 1));
  }

  /** Stop the answer playing (the person speaks again, or the session ends). */
  silence() {
    for (const source of this.playing.splice(0)) source.stop();
    this.playAt = 0;
  }

  closed(event) {
    if (event.code !== 1000 && event.code !== 1005) {
      this.output.append(el("p", { class: "error" }, `The live session ended (${event.code} ${event.reason})`));
    }
  }
}

/** The panel: Transcribe or Talk, and one button that starts and stops the microphone. */
export function livePanel(form, output, run) {
  const mode = el("select", { "aria-label": "Mode", name: "mode" });
  mode.append(el("option", { value: "transcribe" }, "Transcribe"), el("option", { value: "talk" }, "Talk"));
  form.append(mode);
  run.textContent = "Start";
  let session = null;
  return async (model) => {
    if (session) {
      session.stop();
      session = null;
      run.textContent = "Start";
      return;
    }
    if (!navigator.mediaDevices?.getUserMedia) throw new Error("This page cannot use a microphone here (it needs https or localhost)");
    output.replaceChildren();
    const live = new LiveSession(mode.value, output);
    try {
      await live.start(model.id);
    } catch (failure) {
      live.stop();
      throw failure;
    }
    session = live;
    run.textContent = "Stop";
  };
}
