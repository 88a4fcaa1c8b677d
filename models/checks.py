"""Argument checks shared by the layers, models and task settings: one line naming the argument."""


def check_integer(name, value, least=1):
    """Raises ValueError naming `name` unless `value` is an int (a bool is not) of at least `least`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        wanted = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ValueError(f"`{name}` must be {wanted}. Received: {name}={value!r}")
