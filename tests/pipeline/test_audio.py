import av
import numpy as np
import pytest

from hotplate.demo_data import write_wav
from pipeline.render.audio import AudioError, load_audio, loudness_envelope, n_video_frames
from pipeline.render.encode import Mp4Writer
from testkit.render_fixtures import speech, write_audio

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

SR = 44100


def tone(seconds=1.0, freq=440.0, amp=0.5, sr=SR):
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(x, sr):
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return np.argmax(spec) * sr / x.size


def test_n_video_frames():
    assert n_video_frames(1.0, 25) == 25
    assert n_video_frames(2.02, 25) == 51  # 50.5 rounds up
    assert n_video_frames(2.019, 25) == 50
    assert n_video_frames(0.0, 25) == 0


def test_wav_is_resampled_once_to_the_asked_rate(tmp_path):
    path = write_audio(tmp_path / "a.wav", tone(1.0, 440.0), SR)
    y = load_audio(path, 16000)
    assert y.dtype == np.float32 and y.ndim == 1
    assert abs(y.size - 16000) <= 32
    assert abs(peak_hz(y, 16000) - 440.0) < 3
    assert abs(np.abs(y[1000:-1000]).max() - 0.5) < 0.01


def test_stereo_is_averaged_to_mono(tmp_path):
    x = tone(1.0, 440.0)
    same = load_audio(write_audio(tmp_path / "same.wav", np.stack([x, x]), SR), SR)
    assert np.abs(same - x).max() < 1e-3  # L = R -> that signal, not +3 dB
    left = load_audio(write_audio(tmp_path / "left.wav", np.stack([x, 0 * x]), SR), SR)
    assert np.abs(left - x / 2).max() < 1e-3


def _formats():
    have = av.codecs_available
    out = [("flac", "flac", None), ("pcm_s16le", "wav", None)]
    out.append(("libmp3lame", "mp3", None) if "libmp3lame" in have else ("libopus", "opus", "ogg"))
    if "aac" in have:
        out.append(("aac", "m4a", "ipod"))
    if "libopus" in have:
        out.append(("libopus", "opus", "ogg"))
    if "libvorbis" in have:
        out.append(("libvorbis", "ogg", "ogg"))
    return out


@pytest.mark.parametrize(("codec", "suffix", "container"), _formats())
def test_common_formats_decode(tmp_path, codec, suffix, container):
    sr = 48000 if codec == "libopus" else SR
    x = tone(1.5, 330.0, 0.4, sr)
    path = write_audio(tmp_path / f"a.{suffix}", np.stack([x, x]), sr, codec, container)
    y = load_audio(path, 16000)
    assert abs(y.size / 16000 - 1.5) < 0.1  # codec priming/padding only
    assert abs(peak_hz(y, 16000) - 330.0) < 5
    rms = float(np.sqrt(np.mean(y[4000:-4000] ** 2)))
    assert abs(rms - 0.4 / np.sqrt(2)) < 0.03


def test_missing_garbage_empty_and_silent_video(tmp_path):
    with pytest.raises(AudioError, match="nope.wav"):
        load_audio(tmp_path / "nope.wav", 16000)
    garbage = tmp_path / "garbage.mp3"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    with pytest.raises(AudioError, match="garbage.mp3"):
        load_audio(garbage, 16000)
    empty = write_wav(tmp_path / "empty.wav", np.zeros(0, np.float32), SR)
    with pytest.raises(AudioError, match="empty.wav.*no samples"):
        load_audio(empty, 16000)
    with Mp4Writer(tmp_path / "video.mp4", 32, 32, 25) as w:
        w.write(np.zeros((32, 32, 3), np.uint8))
    with pytest.raises(AudioError, match="video.mp4.*no audio stream"):
        load_audio(tmp_path / "video.mp4", 16000)
    assert issubclass(AudioError, ValueError)


@pytest.mark.parametrize(
    ("name", "data", "what"),
    [
        ("README.md", b"# hotplate\n\nKeeps avatars hot.\n", "a text file"),
        ("photo.wav", b"\x89PNG\r\n\x1a\n" + bytes(200), "a PNG image"),
        ("noise.mp3", bytes(range(256)) * 20, "not in a format FFmpeg reads"),
    ],
)
def test_a_file_that_is_not_audio_is_named_for_what_it_is(tmp_path, name, data, what):
    """Not FFmpeg's "[Errno 1094995529] Invalid data found": what the file is, what to pass."""
    from pipeline.render.audio import AudioFormatError

    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(AudioFormatError) as err:
        load_audio(path, 16000)
    message = str(err.value)
    assert message.startswith(f"{path} is not audio ({what}")
    assert message.endswith("pass a WAV, MP3, M4A, FLAC or OGG file")
    assert "Errno" not in message and "\n" not in message


def test_silence_gives_a_closed_mouth():
    env = loudness_envelope(np.zeros(16000 * 2, np.float32), 16000, 25)
    assert env.shape == (50,) and env.dtype == np.float32
    assert not env.any()
    # Hiss far below speech level is gated too.
    hiss = np.random.default_rng(0).normal(0, 1e-4, 16000).astype(np.float32)
    assert not loudness_envelope(hiss, 16000, 25).any()


def test_envelope_opens_on_bursts_and_closes_in_pauses():
    sr, fps = 16000, 25
    x = np.concatenate(
        [
            np.concatenate([tone(0.4, 200, 0.5, sr), np.zeros(int(0.4 * sr), np.float32)])
            for _ in range(4)
        ]
    )
    env = loudness_envelope(x, sr, fps)
    on = np.concatenate([np.arange(k * 20 + 2, k * 20 + 10) for k in range(4)])
    off = np.concatenate([np.arange(k * 20 + 14, k * 20 + 20) for k in range(4)])
    assert env[on].min() > 0.8
    assert env[off].max() < 0.05


def test_envelope_follows_speech_and_ignores_recording_level():
    x = speech(6.0, 16000, seed=1)
    env = loudness_envelope(x, 16000, 25)
    assert env.shape == (150,)
    assert 0.0 <= env.min() and env.max() <= 1.0
    assert env.max() > 0.9  # loud syllables open the mouth fully
    assert env.min() < 0.05  # and it closes between them
    # 10 dB quieter: the same mouth, but for the quietest tails that meet the gate.
    quiet = loudness_envelope(x * 0.3, 16000, 25)
    assert np.abs(quiet - env).max() < 0.15 and np.abs(quiet - env).mean() < 0.02
    raw = loudness_envelope(x, 16000, 25, smooth=None)
    assert np.corrcoef(raw, env)[0, 1] > 0.8


def test_envelope_rate_follows_fps():
    x = speech(2.0, 48000)
    assert loudness_envelope(x, 48000, 30).shape == (60,)
    assert loudness_envelope(x, 48000, 29.97).shape == (n_video_frames(2.0, 29.97),)


def test_a_clips_spectra_and_rms_are_made_once_per_array_and_read_only():
    from pipeline.render.audio import frame_rms, frame_spectra

    clip = speech(2.0, 48000)
    power, freqs = frame_spectra(clip, 48000, 25.0)
    assert frame_spectra(clip, 48000, 25.0)[0] is power  # the drive's and the bank's ask
    again = frame_spectra(clip.copy(), 48000, 25.0)[0]  # another array: made anew, equal
    assert again is not power and np.array_equal(again, power)
    assert frame_spectra(clip, 48000, 50.0)[0].shape[0] == 2 * power.shape[0]
    rms = frame_rms(clip, 48000, 25.0)
    assert frame_rms(clip, 48000, 25.0) is rms
    assert not power.flags.writeable and not rms.flags.writeable and not freqs.flags.writeable
    with pytest.raises(ValueError):
        rms *= 2  # shared: nobody may change it
