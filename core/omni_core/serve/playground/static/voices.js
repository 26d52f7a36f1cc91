// The voices panel: the server's voices (built-in, then saved), saving one from a reference clip
// and its transcript, deleting a saved one. The other panels' voice pickers follow through onVoices.

import { getJson, request } from "./api.js";
import { AudioInput } from "./audio-input.js";
import { $, busy, seconds } from "./ui.js";

const listeners = [];

export function onVoices(listener) {
  listeners.push(listener);
}

export async function refreshVoices() {
  const { data } = await getJson("v1/audio/voices");
  $("#voices-list").replaceChildren(...data.map(voiceItem));
  for (const listener of listeners) listener(data);
}

export function setupVoices() {
  const clip = new AudioInput($("#voice-audio"));
  const name = $("#voice-name");
  const text = $("#voice-text");
  const error = $("#voices-error");

  $("#voice-form").addEventListener("submit", (event) => {
    event.preventDefault();
    busy($("#voice-save"), error, async () => {
      const form = new FormData();
      form.append("name", name.value);
      if (clip.blob) form.append("file", clip.blob, clip.name || "reference.wav");
      form.append("text", text.value);
      await request("v1/audio/voices", { method: "POST", form });
      name.value = "";
      text.value = "";
      clip.clear();
      await refreshVoices();
    });
  });
  $("#voices-list").addEventListener("click", (event) => {
    const button = event.target.closest("button.delete");
    if (!button) return;
    const id = button.closest("li").dataset.voiceId;
    busy(button, error, async () => {
      await request(`v1/audio/voices/${encodeURIComponent(id)}`, { method: "DELETE" });
      await refreshVoices();
    });
  });
}

function voiceItem(voice) {
  const item = document.createElement("li");
  item.dataset.voiceId = voice.id;
  const name = document.createElement("strong");
  name.className = "name";
  name.textContent = voice.name;
  const about = document.createElement("span");
  about.className = "about";
  about.textContent =
    voice.type === "saved"
      ? ` saved (${voice.id}), ${seconds(voice.duration)}: “${voice.text}”`
      : ` built-in${voice.description ? `: ${voice.description}` : ""}`;
  item.append(name, about);
  if (voice.type === "saved") {
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "delete";
    remove.textContent = "Delete";
    item.append(" ", remove);
  }
  return item;
}
