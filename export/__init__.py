"""Export and conversion: collaborative re-parametrisation of trained attention (CP); TF-Hub / TF Serving SavedModels to come."""
