"""The folder layout the model checks read (check_model.sh): NAME/calib/000.npy ... (one sample or
batch per file), NAME/eval/000.npy (the evaluation batch) plus 001..004.npy (that batch perturbed
by 1e-6 relative, the noise floor of check_model.mjs), and NAME/input_name."""
import os

import numpy as np


def save(folder, arrays):
    os.makedirs(folder, exist_ok=True)
    for i, a in enumerate(arrays):
        np.save(os.path.join(folder, f"{i:03d}.npy"), a)


def write_layout(folder, calib, eval_batch, input_name):
    save(os.path.join(folder, "calib"), calib)
    evaluation = [eval_batch]
    for seed in range(2, 6):
        noise = np.random.default_rng(seed).standard_normal(eval_batch.shape).astype(np.float32)
        evaluation.append(eval_batch * (1 + noise * np.float32(1e-6)))
    save(os.path.join(folder, "eval"), evaluation)
    with open(os.path.join(folder, "input_name"), "w") as f:
        f.write(input_name)
