"""The language-model objective and learning-rate schedule shared by every LM training run."""

import keras


@keras.saving.register_keras_serializable(package="concise_attention")
class WarmupRsqrtSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `learning_rate`, then `learning_rate * sqrt(warmup_steps / step)`
    ("rsqrt", tensor2tensor's linear_warmup * rsqrt_decay) or constant."""

    def __init__(self, learning_rate, warmup_steps, decay="rsqrt"):
        self.learning_rate = learning_rate
        self.warmup_steps = warmup_steps
        self.decay = decay

    def __call__(self, step):
        step = keras.ops.cast(step, "float32") + 1.0
        warmup = keras.ops.cast(max(self.warmup_steps, 1), "float32")
        factor = keras.ops.minimum(1.0, step / warmup)
        if self.decay == "rsqrt":
            factor = keras.ops.minimum(factor, keras.ops.sqrt(warmup / step))
        return self.learning_rate * factor

    def get_config(self):
        return {"learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps, "decay": self.decay}


@keras.saving.register_keras_serializable(package="concise_attention")
class NextTokenLoss(keras.losses.Loss):
    """Cross-entropy from logits with label smoothing, averaged over weighted tokens only."""

    def __init__(self, label_smoothing=0.0, name="next_token_loss", **kwargs):
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
