"""The prediction: contention and step models, the timing model, the check that proves and predicts a schedule, and the
projection to paper scale."""
