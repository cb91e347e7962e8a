"""Trajectory viewers (terminal and HTML)."""
