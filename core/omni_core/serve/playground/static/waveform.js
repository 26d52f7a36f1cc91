// The waveform of a clip: each column of the canvas spans the lowest to the highest sample it covers.

export function drawWaveform(canvas, samples) {
  const g = canvas.getContext("2d");
  const { width, height } = canvas;
  g.clearRect(0, 0, width, height);
  g.fillStyle = getComputedStyle(canvas).color;
  const perColumn = samples.length / width;
  for (let x = 0; x < width && perColumn > 0; x++) {
    let low = 1;
    let high = -1;
    const end = Math.min(samples.length, Math.ceil((x + 1) * perColumn));
    for (let i = Math.floor(x * perColumn); i < end; i++) {
      low = Math.min(low, samples[i]);
      high = Math.max(high, samples[i]);
    }
    if (high < low) continue;
    const top = ((1 - Math.min(1, high)) / 2) * height;
    const bottom = ((1 - Math.max(-1, low)) / 2) * height;
    g.fillRect(x, top, 1, Math.max(1, bottom - top));
  }
  canvas.hidden = false;
}
