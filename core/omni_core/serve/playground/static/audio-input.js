// An audio field: a file to upload or a recording from the microphone, with a preview to hear it.

import { wavBlob } from "./audio.js";
import { Recorder } from "./recorder.js";
import { $ } from "./ui.js";

export class AudioInput {
  constructor(container) {
    container.append($("#audio-input-template").content.cloneNode(true));
    this.fileInput = $(".audio-file", container);
    this.recordButton = $(".audio-record", container);
    this.note = $(".audio-note", container);
    this.preview = $(".audio-preview", container);
    this.blob = null;
    this.name = "";
    this.recorder = null;
    this.fileInput.addEventListener("change", () => {
      const file = this.fileInput.files[0];
      this.set(file ?? null, file?.name ?? "");
    });
    this.recordButton.addEventListener("click", () => this.toggleRecording());
    if (!Recorder.available()) {
      this.recordButton.disabled = true;
      this.recordButton.title = "the browser allows the microphone on https or localhost pages only";
    }
  }

  set(blob, name) {
    this.blob = blob;
    this.name = name;
    if (this.preview.src) URL.revokeObjectURL(this.preview.src);
    this.preview.hidden = !blob;
    if (blob) this.preview.src = URL.createObjectURL(blob);
    else this.preview.removeAttribute("src");
  }

  clear() {
    this.fileInput.value = "";
    this.note.textContent = "";
    this.set(null, "");
  }

  // The format name the API takes for it: the file's extension, "wav" for a recording.
  get format() {
    const extension = this.name.includes(".") ? this.name.split(".").pop().toLowerCase() : "";
    return extension || "wav";
  }

  async toggleRecording() {
    if (this.recorder) {
      const { samples, rate } = this.recorder.stop();
      this.recorder = null;
      this.recordButton.textContent = "Record";
      this.fileInput.value = "";
      this.note.textContent = `recorded ${(samples.length / rate).toFixed(1)} s`;
      this.set(wavBlob(samples, rate), "recording.wav");
      return;
    }
    const recorder = new Recorder();
    try {
      await recorder.start();
    } catch (error) {
      this.note.textContent = `cannot record: ${error.message}`;
      return;
    }
    this.recorder = recorder;
    this.recordButton.textContent = "Stop recording";
    this.note.textContent = "recording…";
  }
}
