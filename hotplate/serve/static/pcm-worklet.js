// AudioWorklet: the microphone's samples (first channel, float32) to the page in ~20 ms
// blocks; the page turns them into s16le and sends them over /v1/live.
"use strict";

class PcmTap extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(Math.round(sampleRate / 50));
    this.used = 0;
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (input) {
      let at = 0;
      while (at < input.length) {
        const n = Math.min(input.length - at, this.block.length - this.used);
        this.block.set(input.subarray(at, at + n), this.used);
        this.used += n;
        at += n;
        if (this.used === this.block.length) {
          this.port.postMessage(this.block.slice(0));
          this.used = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor("pcm-tap", PcmTap);
