"""Training: the train step, the local runner, warm start, evaluation, metrics."""
