"""TensorFlow-only training code: tf.data pipelines, tf.distribute strategies, the trainer (issue 4)."""
