"""The built-in tabular task: numeric feature columns and an integer class label from CSV or Parquet."""
