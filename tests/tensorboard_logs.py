"""Reads the scalars a run logged for TensorBoard (keras.callbacks.TensorBoard's event files)."""

import os

import tensorflow as tf


def logged(directory, tag):
    """(step, value) of every `tag` event in `directory`'s event files, in file order (a step logged twice appears
    twice)."""
    events = []
    for path in sorted(tf.io.gfile.glob(os.path.join(str(directory), "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            events += [(event.step, float(tf.make_ndarray(v.tensor))) for v in event.summary.value if v.tag == tag]
    return events
