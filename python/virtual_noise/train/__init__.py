"""The main job: ``python -m virtual_noise train`` (tasks, training loop, reports)."""
