// Samples in the page: one shared AudioContext, 16-bit PCM and WAV both ways, base64.
// int16 <-> float uses 32767 both ways, as the server does, so samples survive a round trip.

let context = null;

// Browsers start an AudioContext suspended until the user acts: resume it on each use.
export async function audioContext() {
  context ??= new AudioContext();
  if (context.state === "suspended") await context.resume();
  return context;
}

export function concat(chunks) {
  const out = new Float32Array(chunks.reduce((total, chunk) => total + chunk.length, 0));
  let offset = 0;
  for (const chunk of chunks) {
    out.set(chunk, offset);
    offset += chunk.length;
  }
  return out;
}

export function toInt16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    out[i] = Math.max(-32768, Math.min(32767, Math.round(samples[i] * 32767)));
  }
  return out;
}

// 16-bit little-endian mono, what response_format "pcm" is.
export function pcmBlob(samples) {
  return new Blob([toInt16(samples)], { type: "audio/pcm" });
}

export function wavBlob(samples, rate) {
  const header = new DataView(new ArrayBuffer(44));
  const ascii = (offset, text) => [...text].forEach((c, i) => header.setUint8(offset + i, c.charCodeAt(0)));
  const bytes = samples.length * 2;
  ascii(0, "RIFF");
  header.setUint32(4, 36 + bytes, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true); // PCM
  header.setUint16(22, 1, true); // mono
  header.setUint32(24, rate, true);
  header.setUint32(28, rate * 2, true);
  header.setUint16(32, 2, true);
  header.setUint16(34, 16, true);
  ascii(36, "data");
  header.setUint32(40, bytes, true);
  return new Blob([header, toInt16(samples)], { type: "audio/wav" });
}

// Streamed 16-bit PCM to float samples, chunk by chunk: a chunk may end inside a sample, and a
// streamed WAV (rate null) starts with a header that names the rate.
export class Pcm16Stream {
  constructor(rate = null) {
    this.rate = rate;
    this.pending = new Uint8Array(0);
  }

  push(bytes) {
    let data = joinBytes(this.pending, bytes);
    if (this.rate === null) {
      const header = wavHeader(data);
      if (header === null) {
        this.pending = data;
        return new Float32Array(0);
      }
      this.rate = header.rate;
      data = data.subarray(header.dataOffset);
    }
    const whole = data.length - (data.length % 2);
    this.pending = data.slice(whole);
    const view = new DataView(data.buffer, data.byteOffset, whole);
    const out = new Float32Array(whole / 2);
    for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32767;
    return out;
  }
}

function joinBytes(a, b) {
  if (a.length === 0) return b;
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

// {rate, dataOffset} once the bytes hold the header up to the "data" chunk, else null.
function wavHeader(bytes) {
  if (bytes.length < 12) return null;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
  const tag = (offset) => String.fromCharCode(...bytes.subarray(offset, offset + 4));
  if (tag(0) !== "RIFF" || tag(8) !== "WAVE") throw new Error("the audio stream is not WAV");
  let rate = null;
  for (let offset = 12; offset + 8 <= bytes.length; ) {
    const size = view.getUint32(offset + 4, true);
    if (tag(offset) === "data") return rate === null ? null : { rate, dataOffset: offset + 8 };
    if (tag(offset) === "fmt ") {
      if (offset + 16 > bytes.length) return null;
      if (view.getUint16(offset + 10, true) !== 1) throw new Error("the audio stream is not mono");
      rate = view.getUint32(offset + 12, true);
    }
    offset += 8 + size + (size % 2);
  }
  return null;
}

// A compressed file (mp3, flac, opus...) decoded whole, at the AudioContext's rate.
export async function decodeFile(blob) {
  const ctx = await audioContext();
  const buffer = await ctx.decodeAudioData(await blob.arrayBuffer());
  return { samples: buffer.getChannelData(0), rate: buffer.sampleRate };
}

export function base64ToBytes(text) {
  const binary = atob(text);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}

export async function blobToBase64(blob) {
  const url = await new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
  return url.slice(url.indexOf(",") + 1); // the bytes only: the server reads plain base64
}
