// Records the microphone as samples (an AudioWorklet copies them out of the audio thread), so a
// recording becomes a WAV file the server decodes, not a browser-specific container.

import { audioContext, concat } from "./audio.js";

let workletLoaded = null;

export class Recorder {
  static available() {
    return Boolean(navigator.mediaDevices?.getUserMedia) && "AudioWorkletNode" in window;
  }

  async start() {
    const ctx = await audioContext();
    workletLoaded ??= ctx.audioWorklet.addModule(new URL("./recorder-worklet.js", import.meta.url));
    await workletLoaded;
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    this.rate = ctx.sampleRate;
    this.chunks = [];
    this.source = ctx.createMediaStreamSource(this.stream);
    // no outputs: the browser runs it for its input alone, and nothing reaches the speakers
    this.node = new AudioWorkletNode(ctx, "pcm-recorder", { numberOfOutputs: 0 });
    this.node.port.onmessage = (event) => this.chunks.push(event.data);
    this.source.connect(this.node);
  }

  // The samples so far and their rate; the microphone is released.
  stop() {
    this.source.disconnect();
    this.node.port.postMessage("stop");
    this.node.port.onmessage = null;
    for (const track of this.stream.getTracks()) track.stop();
    return { samples: concat(this.chunks), rate: this.rate };
  }
}
