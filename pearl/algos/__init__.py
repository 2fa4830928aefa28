"""Algorithms: networks, losses and update rules in plain PyTorch, with no device decisions."""
