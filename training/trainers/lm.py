"""A short in-memory language-model run with `model.fit` (the Admin study and its test).

No checkpoints, no strategy: `training.trainers.trainer` is the resumable, distributed trainer.
"""

import keras
import numpy as np

from concise_attention.training.data.packing import next_token_targets
from concise_attention.training.tasks.objectives import TokenCrossEntropy
from concise_attention.training.tasks.objectives import WarmupDecaySchedule


class _BatchLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(logs["loss"]))


def fit_language_model(
    model,
    packed,
    steps,
    batch_size=16,
    learning_rate=5e-4,
    warmup_steps=50,
    steps_per_point=10,
    seed=0,
    jit_compile=True,
):
    """Trains `model` (a CausalLM) on packed rows for `steps` steps; returns the loss curve.

    Args:
        model: a `CausalLM`.
        packed: output of `training.data.packing.pack_sentences`.
        steps: optimiser steps.
        batch_size: rows per step.
        learning_rate, warmup_steps: Adam with linear warm-up.
        steps_per_point: the curve has one point (mean loss) per this many steps.
        seed: shuffling seed.
        jit_compile: compile the train step with XLA (slow to compile for deep models).

    Returns:
        List of mean training losses (nats per predicted token), one per `steps_per_point`.
    """
    labels, weights = next_token_targets(packed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(np.resize(np.arange(len(labels)), steps * batch_size))
    inputs = {name: value[order] for name, value in packed.items()}
    model.compile(
        optimizer=keras.optimizers.Adam(
            WarmupDecaySchedule(learning_rate, warmup_steps, decay="constant"), clipnorm=1.0
        ),
        loss=TokenCrossEntropy(),
        jit_compile=jit_compile,
    )
    model.optimizer.build(model.trainable_variables)  # here, not in the first trace (which would then run twice)
    recorder = _BatchLosses()
    model.fit(
        inputs,
        labels[order],
        sample_weight=weights[order],
        batch_size=batch_size,
        epochs=steps // steps_per_point,
        steps_per_epoch=steps_per_point,
        shuffle=False,
        callbacks=[recorder],
        verbose=0,
    )
    return recorder.losses
