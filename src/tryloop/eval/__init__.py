"""`tryloop eval`: a policy over a split of the task store, k samples per task, with a report."""
