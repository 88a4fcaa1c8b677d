"""Builders whose constructor arguments are their config (as keras-hub's backbones)."""

import inspect

import keras

# Constructor parameters that are not hyper-parameters of the model.
NOT_CONFIG = ("self", "dtype", "kwargs")


def _plain(value):
    return dict(value) if isinstance(value, dict) else value


class ArgumentsAreConfig:
    """Mixin for functional `keras.Model` builders: `cls(**get_config())` rebuilds the model.

    The config fields are read off the constructor's signature, so the arguments, the
    saved config and the `configs` dataclasses cannot drift apart.
    """

    @classmethod
    def config_arguments(cls):
        """The constructor's hyper-parameter names, in signature order."""
        return tuple(name for name in inspect.signature(cls.__init__).parameters if name not in NOT_CONFIG)

    def _keep_arguments(self, arguments):
        """Stores the hyper-parameters (call after `keras.Model.__init__`), and the `dtype` its layers were built with,
        which a functional model's constructor drops: without it `get_config` recorded float32, and a mixed-precision
        model saved and loaded again came back in float32."""
        for name in self.config_arguments():
            setattr(self, name, arguments[name])
        self._layers_dtype = arguments.get("dtype")

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(keras.dtype_policies.get(self._layers_dtype or self.dtype_policy)),
            # Keras wraps dict attributes (the nested attention config) in a TrackedDict.
            **{name: _plain(getattr(self, name)) for name in self.config_arguments()},
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
