#!/usr/bin/env python3
"""Data and scores for the Silero voice-activity detector that npm @ricky0123/vad-web@0.0.31
ships (dist/silero_vad_v5.onnx: inputs `input` [batch, 512] at 16 kHz, `state` [2, batch, 128],
`sr`; outputs the speech probability and the next state).

The speech is synthesized here with Debian's espeak-ng (several voices and speeds), never taken
from anyone's recordings, and mixed with silence and background noise, in one of three renderings
that differ in every respect a recording can (--rendering):
  clean  close microphone: white noise at a level that changes every second, a 50 Hz hum
  phone  a telephone line: band-limited to 300-3400 Hz through an 8 kHz channel, mu-law
         companded, louder speech with clipping, babble of other synthesized voices underneath
  room   far field: reverberation (an exponentially decaying noise tail of 0.2-0.6 s), quiet
         speech, pink noise and a passing tone (a fan, a machine) that rises and falls
  render   AUDIO.npy --seconds S --seed N [--rendering R]   a float32 16 kHz recording
  records  AUDIO.npy STATES.npy OUT_DIR       calibration samples in ONNX's test-data layout, one
                                             per 512-sample chunk, with the state the float
                                             model carried into it (STATES from vad_stream.mjs)
  score    PROBS.npy FP32_PROBS.npy           worst and mean |difference| of the speech
                                             probability, and agreement of the decisions at 0.5

    /usr/bin/python3 tests/real_models/vad.py render calib.npy --seconds 12 --seed 1
"""
import argparse
import os
import subprocess
import tempfile
import wave

import numpy as np
from onnx import numpy_helper

RATE = 16000
CHUNK = 512
VOICES = ["en", "en-us", "en-gb-scotland", "de", "fr", "es", "it", "nl", "sv", "pl"]
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please send the report to the office before noon tomorrow.",
    "Turn left at the second station and walk to the market.",
    "Seven hundred and twelve people signed up for the morning class.",
    "Can you hear me clearly, or should I speak a little louder?",
    "The weather in the north will be cold with light rain.",
    "Our meeting starts at half past nine in room four.",
    "She paid the invoice and asked for a new receipt.",
]


def speak(text, voice, speed, pitch):
    """espeak-ng's waveform of text, resampled to 16 kHz, peak 1."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.wav")
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", path, text], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with wave.open(path) as w:
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float64)
    t = np.arange(int(len(x) * RATE / rate)) / RATE
    y = np.interp(t, np.arange(len(x)) / rate, x)
    return y / max(np.abs(y).max(), 1.0)


def speech_track(rng, total, gains, pauses):
    """Sentences at random voices, speeds and pitches, with pauses between them."""
    audio = np.zeros(total)
    at = int(rng.uniform(0.3, 1.0) * RATE)
    while at < total:
        s = speak(SENTENCES[rng.integers(len(SENTENCES))], VOICES[rng.integers(len(VOICES))],
                  int(rng.integers(120, 200)), int(rng.integers(30, 70)))
        end = min(total, at + len(s))
        audio[at:end] += rng.uniform(*gains) * s[:end - at]
        at = end + int(rng.uniform(*pauses) * RATE)
    return audio


def band_pass(x, low, high):
    """Zeroes the spectrum outside [low, high] Hz."""
    spectrum = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(len(x), 1 / RATE)
    spectrum[(freqs < low) | (freqs > high)] = 0
    return np.fft.irfft(spectrum, len(x))


def pink_noise(rng, n):
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum /= np.sqrt(np.maximum(np.fft.rfftfreq(n, 1 / RATE), 20.0))
    x = np.fft.irfft(spectrum, n)
    return x / np.abs(x).max()


def render_clean(rng, total):
    audio = speech_track(rng, total, (0.1, 0.8), (0.4, 1.5))
    # Background: white noise whose level changes every second, and a low hum in some seconds.
    for start in range(0, total, RATE):
        n = min(RATE, total - start)
        level = rng.choice([0.0005, 0.003, 0.01, 0.03])
        audio[start:start + n] += level * rng.standard_normal(n)
        if rng.random() < 0.3:
            audio[start:start + n] += 0.02 * np.sin(2 * np.pi * 50 * np.arange(n) / RATE)
    return audio


def render_phone(rng, total):
    audio = speech_track(rng, total, (0.6, 1.4), (0.2, 1.0))
    # Babble: other voices, quiet and continuous, as in a call from a busy place.
    audio += rng.uniform(0.03, 0.1) * speech_track(rng, total, (0.5, 1.0), (0.0, 0.3))
    audio += 0.002 * rng.standard_normal(total)
    # The line: 8 kHz channel (every other sample, held), 300-3400 Hz, mu-law at 8 bits, clipping.
    audio = band_pass(np.clip(audio, -1, 1), 300, 3400)
    audio[1::2] = audio[0::2][:len(audio[1::2])]
    mu = 255.0
    coded = np.round(np.sign(audio) * np.log1p(mu * np.minimum(np.abs(audio), 1)) / np.log1p(mu) * 127) / 127
    return np.sign(coded) * np.expm1(np.abs(coded) * np.log1p(mu)) / mu


def render_room(rng, total):
    dry = speech_track(rng, total, (0.05, 0.3), (0.6, 2.0))
    tail = rng.uniform(0.2, 0.6)
    t = np.arange(int(tail * RATE)) / RATE
    impulse = rng.standard_normal(len(t)) * np.exp(-6.9 * t / tail)  # -60 dB at the tail's end
    impulse[0] = 1.0
    n = 1 << int(np.ceil(np.log2(total + len(impulse))))
    wet = np.fft.irfft(np.fft.rfft(dry, n) * np.fft.rfft(impulse, n), n)[:total]
    audio = wet / max(np.abs(wet).max(), 1e-9) * np.abs(dry).max()
    audio += rng.uniform(0.005, 0.03) * pink_noise(rng, total)
    hum = rng.uniform(80, 400)
    envelope = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(total) / total)
    return audio + 0.01 * envelope * np.sin(2 * np.pi * hum * np.arange(total) / RATE)


RENDERINGS = {"clean": render_clean, "phone": render_phone, "room": render_room}


def render(out, seconds, seed, rendering="clean"):
    rng = np.random.default_rng(seed)
    audio = RENDERINGS[rendering](rng, int(seconds * RATE))
    np.save(out, np.clip(audio, -1, 1).astype(np.float32))


def records(audio_path, states_path, out):
    audio = np.load(audio_path)
    states = np.load(states_path)
    for k in range(len(states)):
        d = os.path.join(out, f"test_data_set_{k}")
        os.makedirs(d, exist_ok=True)
        arrays = [("input", audio[k * CHUNK:(k + 1) * CHUNK][None].astype(np.float32)),
                  ("state", states[k].astype(np.float32)), ("sr", np.array(RATE, dtype=np.int64))]
        for i, (name, a) in enumerate(arrays):
            with open(os.path.join(d, f"input_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(a, name).SerializeToString())


def score(probs_path, fp32_path):
    p = np.load(probs_path).astype(np.float64).ravel()
    f = np.load(fp32_path).astype(np.float64).ravel()
    d = np.abs(p - f)
    agree = ((p > 0.5) == (f > 0.5)).mean()
    speech = (f > 0.5).mean()
    print(f"worst-diff {d.max():.4f} mean-diff {d.mean():.4f} decisions {100 * agree:.2f}% "
          f"speech-in-fp32 {100 * speech:.1f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    r.add_argument("out")
    r.add_argument("--seconds", type=float, default=12)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--rendering", choices=sorted(RENDERINGS), default="clean")
    c = sub.add_parser("records")
    c.add_argument("audio")
    c.add_argument("states")
    c.add_argument("out")
    s = sub.add_parser("score")
    s.add_argument("probs")
    s.add_argument("fp32")
    a = ap.parse_args()
    if a.cmd == "render":
        render(a.out, a.seconds, a.seed, a.rendering)
    elif a.cmd == "records":
        records(a.audio, a.states, a.out)
    else:
        score(a.probs, a.fp32)


if __name__ == "__main__":
    main()
