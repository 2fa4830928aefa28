"""Shipped experiment configs (YAML); `pearl train` uses cartpole_dqn.yaml when none is given."""
