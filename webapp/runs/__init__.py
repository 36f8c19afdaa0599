"""Experiment manager: runs, their metrics, samples, checkpoints; launch/cancel services; live consumer."""
