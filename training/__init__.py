"""Training code. TensorFlow: tf.data pipelines, tf.distribute strategies, the trainer. TensorFlow-free: the prepared-data format (shards.py), objectives.py and the JAX shard trainer."""
