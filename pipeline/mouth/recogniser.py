"""PocketSphinx's phone recogniser: its US English acoustic model and phone language
model ship inside the `pocketsphinx` wheel (BSD licence); nothing is downloaded."""

from __future__ import annotations

import numpy as np

RATE = 16000  # Hz: the acoustic model's rate
LOWPASS_TAPS = 127  # the resampler's anti-alias filter
BLOCK_SECONDS = 0.05  # audio the decoder is handed at a time (it holds the GIL meanwhile)


def _decoder():
    import pocketsphinx

    model = pocketsphinx.get_model_path()
    return pocketsphinx.Decoder(
        hmm=f"{model}/en-us/en-us",
        allphone=f"{model}/en-us/en-us-phone.lm.bin",
        lm=None,
        dict=None,
        loglevel="ERROR",
        beam=1e-20,  # the widest search: phones, unlike words, have no dictionary to prune by
        pbeam=1e-20,
        lw=2.0,
    )


def hear(samples: np.ndarray, sr: int) -> list[tuple[str, int, int]]:
    """(phone, first, last 10 ms frame) of mono float `samples` at `sr`, heard as one
    utterance by a decoder of its own."""
    if sr != RATE:
        samples = resample(samples, sr, RATE)
    pcm = (np.clip(np.asarray(samples, np.float32), -1.0, 1.0) * 32767).astype("<i2").tobytes()
    # a decoder per utterance (25 ms to make): one carries what it heard into the next
    # (its cepstral mean among others), so the same audio would be heard differently
    # after other audio, and a stream would not show what its file shows
    dec = _decoder()
    dec.start_utt()
    # in blocks: the decoder holds the GIL while it works, and a render's threads wait
    # on a whole piece's worth of it (a 20 s stream's first fragment 0.7-1.0 s, not 0.3)
    block = 2 * int(RATE * BLOCK_SECONDS)
    for at in range(0, len(pcm), block):
        dec.process_raw(pcm[at : at + block])
    dec.end_utt()
    return [(s.word, s.start_frame, s.end_frame) for s in dec.seg()]


def resample(samples: np.ndarray, sr: int, to: int) -> np.ndarray:
    """`samples` at rate `to`: low-passed below the new Nyquist first when it is lower (a
    windowed sinc, zero phase: no delay), then linearly interpolated."""
    x = np.asarray(samples, np.float32)
    if to < sr and x.size:
        cut = 0.45 * to / sr  # cycles per input sample, a margin under the new Nyquist
        k = np.arange(-LOWPASS_TAPS // 2 + 1, LOWPASS_TAPS // 2 + 1)
        taps = 2 * cut * np.sinc(2 * cut * k) * np.hamming(k.size)
        x = np.convolve(x, (taps / taps.sum()).astype(np.float32), mode="same")
    n = int(round(x.size * to / sr))
    return np.interp(np.arange(n) * (sr / to), np.arange(x.size), x).astype(np.float32)
