"""TensorFlow-only export code: TF-Hub and TF Serving SavedModels (issue 5), collaborative conversion (issue 6)."""
