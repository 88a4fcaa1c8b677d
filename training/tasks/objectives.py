"""The token cross-entropy, learning-rate schedule and loss scaling shared by the training runs."""

import keras


@keras.saving.register_keras_serializable(package="concise_attention")
class WarmupDecaySchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `learning_rate` over `warmup_steps`, then one of:

    - "rsqrt": `learning_rate * sqrt(warmup_steps / step)` (tensor2tensor's
      linear_warmup * rsqrt_decay, the LM recipe);
    - "linear": linearly down to 0 at `total_steps` (BERT's recipe);
    - "constant".
    """

    def __init__(self, learning_rate, warmup_steps, decay="rsqrt", total_steps=None):
        if decay not in ("rsqrt", "linear", "constant"):
            raise ValueError(f"`decay` must be one of rsqrt, linear, constant. Received: decay={decay!r}")
        if decay == "linear" and (not total_steps or total_steps <= warmup_steps):
            raise ValueError(
                f"Linear decay needs total_steps > warmup_steps. Received: total_steps={total_steps!r}, warmup_steps={warmup_steps!r}"
            )
        self.learning_rate = learning_rate
        self.warmup_steps = warmup_steps
        self.decay = decay
        self.total_steps = total_steps

    def __call__(self, step):
        step = keras.ops.cast(step, "float32") + 1.0
        warmup = keras.ops.cast(max(self.warmup_steps, 1), "float32")
        factor = keras.ops.minimum(1.0, step / warmup)
        if self.decay == "rsqrt":
            factor = keras.ops.minimum(factor, keras.ops.sqrt(warmup / step))
        elif self.decay == "linear":
            remaining = (float(self.total_steps) - step) / float(self.total_steps - self.warmup_steps)
            factor = keras.ops.minimum(factor, keras.ops.maximum(remaining, 0.0))
        return self.learning_rate * factor

    def get_config(self):
        return {
            "learning_rate": self.learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "total_steps": self.total_steps,
        }


@keras.saving.register_keras_serializable(package="concise_attention")
class TokenCrossEntropy(keras.losses.Loss):
    """Cross-entropy from logits with label smoothing, averaged over weighted tokens only."""

    def __init__(self, label_smoothing=0.0, name="token_cross_entropy", **kwargs):
        kwargs.setdefault("reduction", "mean_with_sample_weight")
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing

    def call(self, labels, logits):
        log_probs = keras.ops.log_softmax(keras.ops.cast(logits, "float32"), axis=-1)
        target = -keras.ops.take_along_axis(log_probs, keras.ops.cast(labels, "int32")[..., None], axis=-1)[..., 0]
        if not self.label_smoothing:
            return target
        uniform = -keras.ops.mean(log_probs, axis=-1)
        return (1.0 - self.label_smoothing) * target + self.label_smoothing * uniform

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


def make_optimizer(training):
    """The AdamW of a `TrainingConfig` with its warm-up/decay schedule (both trainers use it).

    LayerNorm scales and offsets, biases and Admin's omegas are not decayed; `training.clip_norm`
    bounds the global norm of each step's gradient (`GlobalClipAdamW`). Under
    training.precision mixed_float16 it is wrapped in dynamic loss scaling (its state stays
    float32).
    """
    optimizer = GlobalClipAdamW(
        clip_norm=training.clip_norm,
        learning_rate=WarmupDecaySchedule(
            training.learning_rate, training.warmup_steps, training.decay, training.train_steps
        ),
        weight_decay=training.weight_decay,
        beta_1=training.adam_beta_1,
        beta_2=training.adam_beta_2,
        epsilon=training.adam_epsilon,
    )
    optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias", "omega"])
    return StepCountingLossScaleOptimizer(optimizer) if training.precision == "mixed_float16" else optimizer


class GlobalClipAdamW(keras.optimizers.AdamW):
    """Keras' AdamW whose gradient, when `clip_norm` is set, is scaled to a global norm of at most `clip_norm`
    (BERT's `clip_by_global_norm`), after the replicas' gradients are summed.

    Keras' own `global_clipnorm` clips each replica's gradient before the sum under tf.distribute, so that
    what it bounds depends on the number of replicas, and counts an embedding row named twice in a batch
    (tf.IndexedSlices) as two rows; here one replica or eight clip the same gradient.
    """

    def __init__(self, clip_norm=None, **kwargs):
        super().__init__(**kwargs)
        self.clip_norm = clip_norm

    def _clip_gradients(self, grads):
        # Under TensorFlow the replicas' gradients are summed after this point: they are clipped there.
        if self.clip_norm is None or keras.backend.backend() == "tensorflow":
            return super()._clip_gradients(grads)
        scale = _clip_scale(grads, self.clip_norm)
        return [None if grad is None else grad * keras.ops.cast(scale, grad.dtype) for grad in grads]

    def _all_reduce_sum_gradients(self, grads_and_vars):
        """Keras' TensorFlow optimizer sums the replicas' gradients here, just before the update step."""
        import tensorflow as tf  # only the TensorFlow backend calls this; the module stays TensorFlow-free

        grads_and_vars = super()._all_reduce_sum_gradients(grads_and_vars)
        if self.clip_norm is None:
            return grads_and_vars
        # An embedding's gradient (tf.IndexedSlices) may name a row twice: its norm is that of the sum. It stays
        # sparse, so that below the norm the update is AdamW's own, bit for bit.
        scale = _clip_scale([None if g is None else tf.convert_to_tensor(g) for g, _ in grads_and_vars], self.clip_norm)

        def scaled(grad):
            if isinstance(grad, tf.IndexedSlices):
                return tf.IndexedSlices(grad.values * tf.cast(scale, grad.values.dtype), grad.indices, grad.dense_shape)
            return None if grad is None else grad * tf.cast(scale, grad.dtype)

        return [(scaled(grad), variable) for grad, variable in grads_and_vars]

    def get_config(self):
        return {**super().get_config(), "clip_norm": self.clip_norm}


def _clip_scale(grads, clip_norm):
    """The factor that brings the dense gradients `grads` (None: a variable without one) to a global norm <= clip_norm."""
    squares = [keras.ops.sum(keras.ops.square(keras.ops.cast(g, "float32"))) for g in grads if g is not None]
    return clip_norm / keras.ops.maximum(keras.ops.sqrt(keras.ops.sum(keras.ops.stack(squares))), clip_norm)


class StepCountingLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras' dynamic loss scaling (mixed_float16), with the steps it skips counted.

    A step whose scaled gradients overflow is skipped (and the scale halved); Keras 3 then
    leaves `iterations` behind, where tf.keras counted it. The trainer's step (its resume
    point, `train_steps`) and the learning-rate schedule count batches, so it is counted.
    """

    def apply(self, grads, trainable_variables=None):
        skipped = keras.ops.logical_not(self.check_finite(grads))
        super().apply(grads, trainable_variables)
        self.iterations.assign_add(keras.ops.cast(skipped, self.iterations.dtype))
