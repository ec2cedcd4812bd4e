"""A training run's work replayed as CUDA graphs on one GPU, for a model bound by kernel launches: the
training step (step.py) and the evals' forwards (evals.py). The run plan's `step_graph` decides for both."""
