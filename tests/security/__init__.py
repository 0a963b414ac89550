"""What loading a file from someone else may and may not do."""
