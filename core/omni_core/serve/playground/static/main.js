// Starts the page: the API key, then what the server serves (/v1/models), which decides the
// tabs shown, then its voices. While the model loads (503) it asks again every few seconds.

import { apiKey, getJson } from "./api.js";
import { setupChat } from "./chat.js";
import { setupSpeech } from "./speech.js";
import { setTabs } from "./tabs.js";
import { setupTranscription } from "./transcription.js";
import { $, showError } from "./ui.js";
import { refreshVoices, setupVoices } from "./voices.js";

// panel -> the tasks that show it
const PANELS = {
  speech: ["speech"],
  transcription: ["transcription", "translation"],
  chat: ["chat"],
  voices: ["speech", "chat"],
};
const RETRY_MS = 2000;

const server = { model: null, family: null, tasks: [] };
const status = $("#server-status");
const keyInput = $("#api-key");
let retry = null;
let loads = 0; // each load counts up: an answer to an older one (the key changed since) is dropped

setupSpeech(server);
setupTranscription(server);
setupChat(server);
setupVoices();

keyInput.value = apiKey.get();
$("#key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  apiKey.set(keyInput.value.trim());
  load();
});
$("#forget-key").addEventListener("click", () => {
  apiKey.set("");
  keyInput.value = "";
  load();
});
load();

async function load() {
  clearTimeout(retry);
  const current = ++loads;
  document.body.dataset.ready = "false";
  setTabs([]);
  status.classList.remove("error");
  status.textContent = "Connecting…";
  let card;
  try {
    [card] = (await getJson("v1/models")).data;
  } catch (error) {
    if (current !== loads) return;
    status.classList.add("error");
    status.textContent = error.message;
    if (error.status === 401) keyInput.focus();
    if (error.status === 503) retry = setTimeout(load, RETRY_MS); // loading, or restarting
    return;
  }
  if (current !== loads) return;
  Object.assign(server, { model: card.id, family: card.family, tasks: card.tasks });
  status.textContent = `${card.id} (family ${card.family}) serves ${card.tasks.join(", ")}`;
  const served = Object.keys(PANELS).filter((panel) => PANELS[panel].some((task) => card.tasks.includes(task)));
  setTabs(served);
  $("#transcription-task-label").hidden = !card.tasks.includes("translation");
  if (served.includes("voices")) await refreshVoices().catch((error) => showError($("#voices-error"), error));
  document.body.dataset.ready = "true";
}
