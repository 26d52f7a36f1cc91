// The speech panel: text to speech with a built-in or saved voice, or cloned from a reference.
// wav and pcm are asked for as a raw PCM stream and play as it arrives; mp3, flac and opus are
// asked for whole and play once decoded (a compressed stream cannot be decoded piece by piece).

import { ApiError, request } from "./api.js";
import { blobToBase64, decodeFile, Pcm16Stream, pcmBlob, wavBlob } from "./audio.js";
import { AudioInput } from "./audio-input.js";
import { StreamPlayer } from "./player.js";
import { $, busy, download, fillVoices, seconds } from "./ui.js";
import { onVoices } from "./voices.js";
import { drawWaveform } from "./waveform.js";

const CLONE = ""; // the voice picker's value for "clone from a reference"
const STREAMED = new Set(["wav", "pcm"]);

export function setupSpeech(server) {
  const voice = $("#speech-voice");
  const reference = new AudioInput($("#speech-reference"));
  const result = $("#speech-result");
  const player = new StreamPlayer();
  let inFlight = null; // the AbortController of the request being played
  let run = 0; // each Play counts up: a playback that ends after a newer Play says nothing

  const showClone = () => {
    $("#speech-clone").hidden = voice.value !== CLONE;
  };
  voice.addEventListener("change", showClone);
  onVoices((voices) => {
    fillVoices(voice, voices, { after: [new Option("Clone from a reference…", CLONE)] });
    showClone();
  });
  $("#speech-stop").addEventListener("click", () => {
    inFlight?.abort();
    player.stop();
    if (result.dataset.state === "done") result.dataset.state = "stopped"; // stopped while it played
  });
  $("#speech-form").addEventListener("submit", (event) => {
    event.preventDefault();
    busy($("#speech-play"), $("#speech-error"), async () => {
      inFlight = new AbortController();
      const current = ++run;
      try {
        await speak(inFlight.signal, current);
      } catch (error) {
        result.dataset.state = error.name === "AbortError" ? "stopped" : "failed";
        throw error;
      } finally {
        inFlight = null;
      }
    });
  });

  async function requestBody(format) {
    const body = {
      model: server.model,
      input: $("#speech-input").value,
      speed: Number($("#speech-speed").value),
      response_format: STREAMED.has(format) ? "pcm" : format,
    };
    if (STREAMED.has(format)) body.stream_format = "audio";
    const seed = $("#speech-seed").value;
    if (seed !== "") body.seed = Number(seed);
    if (voice.value !== CLONE) {
      body.voice = voice.value;
    } else if (reference.blob) {
      body.reference_audio = await blobToBase64(reference.blob);
      const text = $("#speech-reference-text").value.trim();
      if (text) body.reference_text = text;
    } // else neither: the API says what it needs
    return body;
  }

  async function speak(signal, current) {
    const format = $("#speech-format").value;
    const body = await requestBody(format);
    player.reset();
    await player.start();
    result.textContent = "Waiting for the first audio…";
    Object.assign(result.dataset, { state: "requesting", samples: 0, chunks: 0 });
    const started = performance.now();
    const response = await request("v1/audio/speech", { method: "POST", json: body, signal });
    let file;
    if (STREAMED.has(format)) {
      const rate = Number(response.headers.get("X-Sample-Rate"));
      await playStream(response, rate, signal);
      file = format === "wav" ? wavBlob(player.audio(), rate) : pcmBlob(player.audio());
    } else {
      file = await response.blob();
      const { samples, rate } = await decodeFile(file);
      player.push(samples, rate);
      result.dataset.chunks = 1;
    }
    const samples = player.audio();
    const streamMs = Math.round(performance.now() - started);
    const firstAudioMs = Math.round(player.firstPlayAt - started);
    Object.assign(result.dataset, {
      state: "done",
      samples: samples.length,
      sampleRate: player.rate,
      firstAudioMs,
      streamMs,
    });
    result.textContent =
      `${seconds(samples.length / player.rate)} of audio at ${player.rate} Hz in ${result.dataset.chunks} ` +
      `chunk(s): first audio after ${firstAudioMs} ms, the last after ${streamMs} ms`;
    drawWaveform($("#speech-waveform"), samples);
    download($("#speech-download"), file, `speech.${format}`);
    const replay = $("#speech-audio");
    if (replay.src) URL.revokeObjectURL(replay.src);
    replay.src = URL.createObjectURL(format === "pcm" ? wavBlob(samples, player.rate) : file);
    replay.hidden = false;
    player.ended.then(() => {
      if (current !== run || result.dataset.state !== "done") return;
      // the audio clock ran past the last chunk's end: the whole reply went to the speakers
      Object.assign(result.dataset, { state: "played", playedSeconds: player.playedSeconds.toFixed(3) });
    });
  }

  async function playStream(response, rate, signal) {
    const pcm = new Pcm16Stream(rate);
    const reader = response.body.getReader();
    result.dataset.state = "streaming";
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (error) {
        if (signal.aborted) throw error;
        throw new ApiError("the audio stream was cut before its end (the server's log says why)");
      }
      if (chunk.done) return;
      const samples = pcm.push(chunk.value);
      if (samples.length === 0) continue;
      player.push(samples, rate);
      result.dataset.chunks = Number(result.dataset.chunks) + 1;
      result.dataset.samples = player.samples;
      result.textContent = `Playing: ${seconds(player.samples / rate)} received`;
    }
  }
}
