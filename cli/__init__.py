"""The console entry points, thin, above everything they call: concise-train (train.py), concise-export
(export.py), concise-collaborative, concise-evaluate, concise-quickstart; concise-prepare-data is
training.trainers.prepare_data's main."""
