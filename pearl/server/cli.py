"""`pearl replay-server CONFIG | --capacity N --bind ADDR ...`: a replay table behind a socket.

    pearl replay-server --capacity 1000000 --kind prioritized --plaintext      # 127.0.0.1:5555
    pearl replay-server server.yaml                                            # docs/REPLAY_SERVER.md
    pearl replay-server --keygen keys/ server                                  # keys/server.key{,_secret}

Flags override the config file. Without --plaintext it needs --server-key and --allow (CURVE).
Prints one line when it listens; SIGTERM or Ctrl-C stops it (a checkpoint in progress finishes).
"""
from __future__ import annotations

import argparse
import signal
import sys

from pearl.errors import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("replay-server", help="serve a replay table over the network (docs/REPLAY_SERVER.md)")
    p.add_argument("config", nargs="?", help="server YAML (table, bind, ratio, auth, checkpoint_dir)")
    p.add_argument("--bind", help="address to listen on (default tcp://127.0.0.1:5555; port 0: any free port)")
    p.add_argument("--capacity", type=int, help="rows the table holds")
    p.add_argument("--kind", help="uniform, prioritized or amper")
    p.add_argument("--obs-dim", type=int, help="a vector observation's size")
    p.add_argument("--obs-shape", help="an observation's shape instead, e.g. 4,10,10 (MinAtar) or 4,84,84")
    p.add_argument("--obs-dtype", help="float32 (default) or uint8 (images)")
    p.add_argument("--frame-stack", type=int, help="a frame table: frames per observation (each stored once; "
                                                   "--obs-shape is one frame's; writers send step records)")
    p.add_argument("--streams", type=int, help="a frame table's env streams (default 1)")
    p.add_argument("--n-step", type=int, help="a frame table's return horizon (default 1)")
    p.add_argument("--gamma", type=float, help="a frame table's discount (default 0.99)")
    p.add_argument("--action-dtype", help="int64 (discrete actions) or float32 (Box actions)")
    p.add_argument("--action-shape", help="per-row action shape, e.g. 6 (default: scalar)")
    p.add_argument("--updates-per-step", type=float, help="keep this replay ratio (one sample = one update)")
    p.add_argument("--learning-starts", type=int, help="env steps before the first update (with --updates-per-step)")
    p.add_argument("--max-lag", type=int, help="updates the learner may trail the count due (credit bound)")
    p.add_argument("--checkpoint-dir", help="write checkpoints here and restart from the latest one")
    p.add_argument("--checkpoint-every", type=float, help="seconds between automatic checkpoints")
    p.add_argument("--server-key", help="the server's CURVE certificate (NAME.key_secret)")
    p.add_argument("--allow", action="append", help="allowed client keys: a directory of *.key, a file or a z85 key")
    p.add_argument("--plaintext", action="store_true", help="no authentication: a private fabric only")
    p.add_argument("--seed", type=int, help="the sampling RNG's seed")
    p.add_argument("--spin-us", type=float, help="spin this long for the next request after a burst before "
                                                 "blocking (lower round-trip latency, some CPU)")
    p.add_argument("--keygen", nargs=2, metavar=("DIR", "NAME"), help="write a CURVE key pair and exit")
    return p


def run(args) -> int:
    if args.keygen:
        from pearl.server.keys import generate

        public, secret = generate(*args.keygen)
        print(f"wrote {public} (share) and {secret} (keep private)")
        return 0
    from pearl.server.config import STANDALONE_SPIN_US, AuthConfig, RatioConfig, load_config

    raw: dict = {}
    if args.config:
        import yaml
        from pathlib import Path

        if not Path(args.config).is_file():
            raise ConfigError(f"{args.config}: no such config file")
        raw = yaml.safe_load(Path(args.config).read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{args.config}: expected a mapping at the top level")
    table = dict(raw.get("table") or {})
    for flag, key in (("capacity", "capacity"), ("kind", "kind"), ("obs_dim", "obs_dim"),
                      ("obs_dtype", "obs_dtype"), ("action_dtype", "action_dtype"), ("frame_stack", "frame_stack"),
                      ("streams", "streams"), ("n_step", "n_step"), ("gamma", "gamma")):
        if getattr(args, flag) is not None:
            table[key] = getattr(args, flag)
            if key == "obs_dim":  # a flag replaces the file's observation shape
                table.pop("obs_shape", None)
    for flag, example in (("action_shape", "6 or 2,3"), ("obs_shape", "4,10,10")):
        text = getattr(args, flag)
        if text is not None:
            try:
                table[flag] = [int(d) for d in text.split(",") if d]
                if flag == "obs_shape":
                    table.pop("obs_dim", None)
            except ValueError:
                raise ConfigError(f"--{flag.replace('_', '-')}: {text!r} (expected e.g. {example})") from None
    raw["table"] = table
    for flag, key in (("bind", "bind"), ("checkpoint_dir", "checkpoint_dir"),
                      ("checkpoint_every", "checkpoint_every_s"), ("seed", "seed"), ("spin_us", "spin_us")):
        if getattr(args, flag) is not None:
            raw[key] = getattr(args, flag)
    raw.setdefault("spin_us", STANDALONE_SPIN_US)  # its own process: no host threads to starve
    if args.updates_per_step is not None or args.learning_starts is not None or args.max_lag is not None:
        ratio = dict(raw.get("ratio") or vars(RatioConfig()))
        for flag in ("updates_per_step", "learning_starts", "max_lag"):
            if getattr(args, flag) is not None:
                ratio[flag] = getattr(args, flag)
        raw["ratio"] = ratio
    if args.plaintext or args.server_key or args.allow:
        auth = dict(raw.get("auth") or {})
        auth.setdefault("plaintext", False)
        if args.plaintext:
            auth.update(plaintext=True, server_secret=None, allow=[])
        if args.server_key:
            auth.update(server_secret=args.server_key, plaintext=False)
        if args.allow:
            auth["allow"] = list(auth.get("allow") or []) + args.allow
        raw["auth"] = auth
    elif "auth" not in raw:
        raw["auth"] = vars(AuthConfig(plaintext=False))  # no silent plaintext: say which
    config = load_config(raw)
    for entry in config.auth.allow:
        from pathlib import Path

        if not isinstance(entry, str) or not (Path(entry).exists() or len(entry) == 40):
            raise ConfigError(f"auth.allow: {entry!r} is neither a key file, a directory nor a z85 key")
    if config.auth.server_secret and not __import__("pathlib").Path(config.auth.server_secret).is_file():
        raise ConfigError(f"auth.server_secret: {config.auth.server_secret}: no such file")
    try:
        import zmq  # noqa: F401
    except ImportError:
        raise ConfigError("the replay server needs pyzmq: pip install 'pearl-rl[server]'") from None
    from pearl.server.server import ReplayServer

    try:
        server = ReplayServer(config)
    except (ValueError, OSError) as error:  # e.g. a checkpoint of another table shape
        raise ConfigError(f"replay server: {error}") from None
    signal.signal(signal.SIGTERM, lambda *_: server._stop.set())
    t = config.table
    import threading

    def serve():
        try:
            server.serve_forever()
        except Exception:
            pass  # reported below from server._error

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    server._ready.wait(30)
    if server._error is not None or server.address is None:
        thread.join(5)
        raise ConfigError(f"bind: could not listen on {config.bind}: {server._error}")
    restored = f", restored {server.restored['name']} ({server.restored['table']['size']} rows)" if server.restored else ""
    auth = "plaintext (no authentication)" if config.auth.plaintext else "CURVE, allow-list"
    frames = (f", frame table: {t.frame_stack} x {t.obs_dtype}{list(t.observation_shape)} frames per observation, "
              f"{t.streams} streams, n_step {t.n_step}" if t.frame_stack else "")
    print(f"replay server: listening on {server.address} ({t.kind}, capacity {t.capacity}{frames}, {auth}{restored})",
          flush=True)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        server._stop.set()
        thread.join(30)
    return 0


def main(argv=None) -> int:
    """`python -m pearl.server.cli ...` (the same as `pearl replay-server ...`)."""
    parser = argparse.ArgumentParser(prog="pearl")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["replay-server"] + list(sys.argv[1:] if argv is None else argv))
    try:
        return run(args)
    except ConfigError as error:
        print(f"pearl: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
