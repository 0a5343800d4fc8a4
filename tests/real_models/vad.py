#!/usr/bin/env python3
"""Data and scores for the Silero voice-activity detector that npm @ricky0123/vad-web@0.0.31
ships (dist/silero_vad_v5.onnx: inputs `input` [batch, 512] at 16 kHz, `state` [2, batch, 128],
`sr`; outputs the speech probability and the next state).

The speech is synthesized here with Debian's espeak-ng (several voices and speeds), never taken
from anyone's recordings, and mixed with silence and background noise at several levels:
  render   AUDIO.npy --seconds S --seed N     a float32 16 kHz recording
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


def render(out, seconds, seed):
    rng = np.random.default_rng(seed)
    total = int(seconds * RATE)
    audio = np.zeros(total)
    at = int(rng.uniform(0.3, 1.0) * RATE)
    while at < total:
        s = speak(SENTENCES[rng.integers(len(SENTENCES))], VOICES[rng.integers(len(VOICES))],
                  int(rng.integers(120, 200)), int(rng.integers(30, 70)))
        gain = rng.uniform(0.1, 0.8)
        end = min(total, at + len(s))
        audio[at:end] += gain * s[:end - at]
        at = end + int(rng.uniform(0.4, 1.5) * RATE)  # a pause
    # Background: white noise whose level changes every second, and a low hum in some seconds.
    for start in range(0, total, RATE):
        n = min(RATE, total - start)
        level = rng.choice([0.0005, 0.003, 0.01, 0.03])
        audio[start:start + n] += level * rng.standard_normal(n)
        if rng.random() < 0.3:
            audio[start:start + n] += 0.02 * np.sin(2 * np.pi * 50 * np.arange(n) / RATE)
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
    c = sub.add_parser("records")
    c.add_argument("audio")
    c.add_argument("states")
    c.add_argument("out")
    s = sub.add_parser("score")
    s.add_argument("probs")
    s.add_argument("fp32")
    a = ap.parse_args()
    if a.cmd == "render":
        render(a.out, a.seconds, a.seed)
    elif a.cmd == "records":
        records(a.audio, a.states, a.out)
    else:
        score(a.probs, a.fp32)


if __name__ == "__main__":
    main()
