// Plays audio through the Web Audio API as it arrives: each chunk becomes a buffer scheduled
// right after the one before, so playback starts with the first chunk, not with the last.

import { audioContext, concat } from "./audio.js";

const LEAD_S = 0.05; // the first chunk, or one after a gap, starts this far ahead: no clipped start

export class StreamPlayer {
  constructor() {
    this.sources = new Set();
    this.reset();
  }

  reset() {
    this.stop();
    this.chunks = [];
    this.samples = 0;
    this.rate = 0;
    this.nextTime = 0;
    this.firstPlayAt = null; // performance.now() when the first chunk was scheduled
    this.startTime = null; // the audio clock's time the first chunk starts at
    this.playedSeconds = 0; // how far the audio clock ran from there to the end of the last chunk
    this.ended = Promise.resolve();
  }

  async start() {
    this.ctx = await audioContext();
  }

  push(samples, rate) {
    if (samples.length === 0) return;
    const buffer = this.ctx.createBuffer(1, samples.length, rate); // the context resamples it
    buffer.copyToChannel(samples, 0);
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.ctx.destination);
    const when = Math.max(this.nextTime, this.ctx.currentTime + LEAD_S);
    source.start(when);
    this.nextTime = when + buffer.duration;
    this.sources.add(source);
    this.ended = new Promise((resolve) => {
      source.onended = () => {
        this.sources.delete(source);
        this.playedSeconds = this.ctx.currentTime - this.startTime;
        resolve();
      };
    });
    this.chunks.push(samples);
    this.samples += samples.length;
    this.rate = rate;
    this.firstPlayAt ??= performance.now();
    this.startTime ??= when;
  }

  stop() {
    for (const source of this.sources) source.stop();
    this.sources.clear();
  }

  audio() {
    return concat(this.chunks);
  }
}
