"""Driving tasks in Gaussian-splat scenes (``drive-lane-keep``, ``drive-avoid``)."""
