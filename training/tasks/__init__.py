"""Tasks: what is specific to one model (data, model, loss, metrics, serving), behind one contract."""
