"""Command-line tools that build offline assets (reward classifiers) for GRUE Studio."""
