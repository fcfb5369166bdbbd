"""Stands for a heavy framework (torch...) in the contract suite's own tests."""
