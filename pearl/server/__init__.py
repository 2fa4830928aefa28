"""A replay memory server between actors and learners (docs/REPLAY_SERVER.md): a PEARL replay
table behind a ZeroMQ ROUTER socket, a binary wire format (no pickle), exactly-once writers,
the replay ratio kept by the server, exact sharded prioritized sampling, CURVE authentication,
checkpoints taken while serving.

Imports pyzmq lazily through its submodules: `pip install pearl-rl[server]`.
"""
from pearl.server.config import ServerConfig, TableConfig, RatioConfig, AuthConfig, load_config  # noqa: F401
