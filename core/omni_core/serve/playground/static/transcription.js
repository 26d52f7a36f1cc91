// The transcription panel: an uploaded or recorded clip to text (or, where the family translates,
// to English), in any response format; verbose_json's segments (and words) are buttons that seek
// the clip to where they were said.

import { events, request } from "./api.js";
import { AudioInput } from "./audio-input.js";
import { $, busy, seconds } from "./ui.js";

export function setupTranscription(server) {
  const input = new AudioInput($("#transcription-input"));
  const audio = input.preview; // the clip being transcribed: its segments seek it
  audio.id = "transcription-audio";
  const result = $("#transcription-result");
  const text = $("#transcription-text");
  const segments = $("#transcription-segments");
  const raw = $("#transcription-raw");

  $("#transcription-form").addEventListener("submit", (event) => {
    event.preventDefault();
    busy($("#transcription-run"), $("#transcription-error"), async () => {
      try {
        await transcribe();
      } catch (error) {
        result.dataset.state = "failed";
        throw error;
      }
    });
  });
  segments.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-start]");
    if (!button) return;
    audio.currentTime = Number(button.dataset.start);
    audio.play().catch((error) => {
      result.textContent = `cannot play the clip: ${error.message}`;
    });
  });
  audio.addEventListener("timeupdate", () => {
    for (const button of segments.querySelectorAll("button.segment")) {
      const [start, end] = [Number(button.dataset.start), Number(button.dataset.end)];
      button.classList.toggle("current", audio.currentTime >= start && audio.currentTime < end);
    }
  });

  function form() {
    const format = $("#transcription-format").value;
    const data = new FormData();
    if (input.blob) data.append("file", input.blob, input.name || "audio.wav");
    data.append("model", server.model);
    data.append("response_format", format);
    // as the user chose: a choice the API refuses (words without verbose_json) gets its message
    if (format === "verbose_json") data.append("timestamp_granularities[]", "segment");
    if ($("#transcription-words").checked) data.append("timestamp_granularities[]", "word");
    if ($("#transcription-stream").checked) data.append("stream", "true");
    const language = $("#transcription-language").value.trim();
    if (language) data.append("language", language);
    return data;
  }

  async function transcribe() {
    const format = $("#transcription-format").value;
    text.textContent = "";
    segments.replaceChildren();
    raw.hidden = true;
    result.textContent = "Transcribing…";
    result.dataset.state = "requesting";
    const response = await request($("#transcription-task").value, { method: "POST", form: form() });
    if ($("#transcription-stream").checked) {
      for await (const event of events(response)) {
        if (event.type === "transcript.text.delta") text.textContent += event.delta;
        if (event.type === "transcript.text.done") text.textContent = event.text;
      }
      result.textContent = "";
    } else if (format === "json" || format === "verbose_json") {
      const body = await response.json();
      text.textContent = body.text;
      showSegments(body.segments ?? []);
      result.textContent = body.duration === undefined ? "" : `${seconds(body.duration)} in ${body.language}`;
      if (body.duration !== undefined) result.dataset.duration = body.duration;
    } else {
      raw.textContent = await response.text();
      raw.hidden = false;
      result.textContent = "";
    }
    result.dataset.segments = segments.children.length;
    result.dataset.state = "done";
  }

  function showSegments(list) {
    for (const segment of list) {
      const item = document.createElement("li");
      item.append(seekButton("segment", segment, `${seconds(segment.start)}–${seconds(segment.end)} ${segment.text}`));
      for (const word of segment.words ?? []) item.append(" ", seekButton("word", word, word.word));
      segments.append(item);
    }
  }
}

function seekButton(kind, { start, end }, label) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = kind;
  Object.assign(button.dataset, { start, end });
  button.textContent = label;
  return button;
}
