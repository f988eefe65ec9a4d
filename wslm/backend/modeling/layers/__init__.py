"""Building blocks the model families share: linear methods, attention, rotary, norms, activations."""
