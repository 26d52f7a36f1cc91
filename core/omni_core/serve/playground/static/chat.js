// The chat panel: a conversation whose turns carry text and an audio part (uploaded or recorded);
// replies stream in, their words as they are written and, with "Reply with audio", their audio
// played as it arrives (a WAV stream: its header names the rate).

import { events, request } from "./api.js";
import { base64ToBytes, blobToBase64, Pcm16Stream, wavBlob } from "./audio.js";
import { AudioInput } from "./audio-input.js";
import { StreamPlayer } from "./player.js";
import { $, busy, fillVoices } from "./ui.js";
import { onVoices } from "./voices.js";

export function setupChat(server) {
  const log = $("#chat-log");
  const message = $("#chat-input");
  const attachment = new AudioInput($("#chat-audio"));
  const voice = $("#chat-voice");
  const player = new StreamPlayer();
  let history = []; // the messages sent so far, as the API takes them

  onVoices((voices) => fillVoices(voice, voices, { before: [new Option("the family's default", "")] }));
  $("#chat-clear").addEventListener("click", () => {
    player.stop();
    history = [];
    log.replaceChildren();
  });
  $("#chat-form").addEventListener("submit", (event) => {
    event.preventDefault();
    busy($("#chat-send"), $("#chat-error"), send);
  });

  async function send() {
    const text = message.value.trim();
    const parts = text ? [{ type: "text", text }] : [];
    if (attachment.blob) {
      const data = await blobToBase64(attachment.blob);
      parts.push({ type: "input_audio", input_audio: { data, format: attachment.format } });
    }
    const turn = { role: "user", content: parts.length === 1 && text ? text : parts };
    const body = { model: server.model, messages: [...history, turn], stream: true };
    const maxTokens = $("#chat-max-tokens").value;
    if (maxTokens !== "") body.max_tokens = Number(maxTokens);
    const seed = $("#chat-seed").value;
    if (seed !== "") body.seed = Number(seed);
    if ($("#chat-speak").checked) {
      body.modalities = ["text", "audio"];
      body.audio = { format: "wav" };
      if (voice.value) body.audio.voice = voice.value;
    }
    const asked = addMessage("user", text, attachment.blob);
    const reply = addMessage("assistant", "", null);
    let words;
    try {
      words = await streamReply(await request("v1/chat/completions", { method: "POST", json: body }), reply);
    } catch (error) {
      asked.remove(); // the turn did not happen: the message stays in the box to send again
      reply.remove();
      throw error;
    }
    history.push(turn, { role: "assistant", content: words });
    message.value = "";
    attachment.clear();
  }

  async function streamReply(response, item) {
    const text = item.querySelector(".text");
    const pcm = new Pcm16Stream();
    player.reset();
    await player.start();
    item.dataset.state = "streaming";
    let words = "";
    for await (const event of events(response)) {
      const delta = event.choices?.[0]?.delta;
      if (!delta) continue; // the usage chunk
      const piece = delta.content ?? delta.audio?.transcript;
      if (piece) {
        words += piece;
        text.textContent = words;
      }
      if (delta.audio?.data) player.push(pcm.push(base64ToBytes(delta.audio.data)), pcm.rate);
    }
    item.dataset.state = "done";
    if (player.samples > 0) {
      const audio = player.audio();
      item.append(audioElement(wavBlob(audio, pcm.rate)));
      Object.assign(item.dataset, { samples: audio.length, sampleRate: pcm.rate });
      const played = player; // a later reply resets the player: this one's end is its own
      const started = player.startTime;
      played.ended.then(() => {
        if (played.startTime !== started) return;
        Object.assign(item.dataset, { state: "played", playedSeconds: played.playedSeconds.toFixed(3) });
      });
    }
    return words;
  }

  function addMessage(role, text, clip) {
    const item = document.createElement("li");
    item.className = `message ${role}`;
    const words = document.createElement("span");
    words.className = "text";
    words.textContent = text;
    item.append(words);
    if (clip) item.append(audioElement(clip));
    log.append(item);
    return item;
  }
}

function audioElement(blob) {
  const audio = document.createElement("audio");
  audio.controls = true;
  audio.src = URL.createObjectURL(blob);
  return audio;
}
