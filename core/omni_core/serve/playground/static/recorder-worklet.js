// Runs in the audio thread: hands the microphone's samples (its first channel) to the page.
class PcmRecorder extends AudioWorkletProcessor {
  constructor() {
    super();
    this.recording = true;
    this.port.onmessage = () => {
      this.recording = false; // any message means stop
    };
  }

  process(inputs) {
    const channel = inputs[0][0];
    if (this.recording && channel) this.port.postMessage(channel.slice());
    return this.recording;
  }
}

registerProcessor("pcm-recorder", PcmRecorder);
